"""One window's generation result, the checks that decide a retry, and segment output."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NotRequired, TypedDict

from faster_whisper.tokenizer import Tokenizer
from faster_whisper.transcribe import TranscriptionOptions, get_compression_ratio

from jobs.outputs import Segment


class RawWord(TypedDict):
    word: str
    start: float
    end: float
    probability: float


class RawSegment(TypedDict):
    """A segment as faster-whisper splits a window (`_split_segments_by_timestamps`, and
    `add_word_timestamps` for its words)."""

    seek: int
    start: float
    end: float
    tokens: list[int]
    words: NotRequired[list[RawWord]]


@dataclass(frozen=True)
class Decoded:
    tokens: list[int]
    avg_logprob: float
    temperature: float
    compression_ratio: float
    no_speech_prob: float

    def needs_fallback(self, opts: TranscriptionOptions) -> bool:
        """Too repetitive or too unlikely, and not silence (`generate_with_fallback`)."""
        ratio = opts.compression_ratio_threshold
        repetitive = ratio is not None and self.compression_ratio > ratio
        logprob = opts.log_prob_threshold
        unlikely = logprob is not None and self.avg_logprob < logprob
        no_speech = opts.no_speech_threshold
        silent = unlikely and no_speech is not None and self.no_speech_prob > no_speech
        return (repetitive or unlikely) and not silent

    def is_silence(self, opts: TranscriptionOptions) -> bool:
        """The window has no speech: skip it (`generate_segments`)."""
        if opts.no_speech_threshold is None or self.no_speech_prob <= opts.no_speech_threshold:
            return False
        return opts.log_prob_threshold is None or self.avg_logprob <= opts.log_prob_threshold

    @staticmethod
    def best(tried: list[Decoded], opts: TranscriptionOptions, temperature: float) -> Decoded:
        """Every try failed: the most likely one under the repetition threshold (or of
        all), carrying the last temperature so that the prompt resets."""
        ratio = opts.compression_ratio_threshold
        below = [d for d in tried if ratio is not None and d.compression_ratio <= ratio]
        pick = max(below or tried, key=lambda d: d.avg_logprob)
        return replace(pick, temperature=temperature)

    def segment(
        self, segment_id: int, seek: int, segment: RawSegment, text: str, limit_s: float
    ) -> Segment:
        """A segment as the job's partial events and output show it. Whisper may place
        a last timestamp in the padding past the audio: times are capped at `limit_s`."""
        end = min(float(segment["end"]), limit_s)
        out: Segment = {
            "id": segment_id,
            "seek": seek,
            "start": round(min(float(segment["start"]), end), 3),
            "end": round(end, 3),
            "text": text,
            "tokens": [int(t) for t in segment["tokens"]],
            "temperature": self.temperature,
            "avg_logprob": round(float(self.avg_logprob), 6),
            "compression_ratio": round(float(self.compression_ratio), 6),
            "no_speech_prob": round(float(self.no_speech_prob), 6),
        }
        if "words" in segment:
            out["words"] = [
                {
                    "word": w["word"],
                    "start": round(min(float(w["start"]), end), 3),
                    "end": round(min(float(w["end"]), end), 3),
                    "probability": round(float(w["probability"]), 4),
                }
                for w in segment["words"]
            ]
        return out


def decoded_from(
    result: Any, tokenizer: Tokenizer | None, temperature: float, length_penalty: float
) -> Decoded:
    """A `WhisperGenerationResult` with faster-whisper's average log probability."""
    assert tokenizer is not None
    tokens = list(result.sequences_ids[0])
    cum_logprob = result.scores[0] * (len(tokens) ** length_penalty)
    text = tokenizer.decode(tokens).strip()
    return Decoded(
        tokens,
        cum_logprob / (len(tokens) + 1),
        temperature,
        get_compression_ratio(text),
        float(result.no_speech_prob),
    )
