"""Whisper decoding of several requests at once: one window of each per forward pass.

Each request is a `Stream` that walks its audio the way `WhisperModel.generate_segments`
walks one file: 30 s windows, timestamps kept, the previous text as the prompt, the next
window starting at the last complete segment, temperature fallback. `decode_step` takes
the current window of every stream, encodes them in one batched call and generates them
in one batched call (each with its own prompt), then advances each stream. Requests share
the forward passes, yet a request's text depends only on its own audio and options: it
equals what it gets alone. (faster-whisper's `BatchedInferencePipeline` instead decodes
independent chunks of one file, by default without timestamps, and keeps no unfinished
tail of a chunk: that loses words at chunk ends.)

One difference from `generate_segments`: a window is conditioned on the last
`context_tokens` tokens of the text so far (faster-whisper: up to 223), because
CTranslate2 batches only prompts of equal length, and a fixed length makes them equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.audio import pad_or_trim
from faster_whisper.tokenizer import Tokenizer
from faster_whisper.transcribe import TranscriptionOptions

from jobs.outputs import Segment
from pipelines.asr.options import DecodeOptions, transcription_options
from pipelines.asr.window_results import Decoded, RawSegment, decoded_from

FRAMES_PER_SECOND = 100
WINDOW_FRAMES = 3000
MAX_PROMPT_TOKENS = 223
"""faster-whisper's cap on previous-text tokens (half the model's 448, less one)."""


@dataclass(eq=False)
class Stream:
    """One request's decoding state."""

    features: np.ndarray
    """Log-mel features of the whole audio, `[n_mels, frames + 1]`."""
    options: DecodeOptions
    first_cut: int | None = None
    """Frame where the first window ends early (None: a full window)."""
    seek: int = 0
    windows: int = 0
    tokens: list[int] = field(default_factory=list)
    prompt_from: int = 0
    last_speech_s: float = 0.0
    language_probability: float = 1.0
    next_id: int = 0
    """The next segment's id: they count from 0, as OpenAI's transcription segments do."""
    tokenizer: Tokenizer | None = None
    opts: TranscriptionOptions | None = None

    @property
    def content_frames(self) -> int:
        return int(self.features.shape[-1]) - 1

    @property
    def done(self) -> bool:
        return self.seek >= self.content_frames

    def window(self) -> tuple[np.ndarray, int]:
        """The mel features of the next window (padded to 30 s) and its size in frames."""
        size = min(WINDOW_FRAMES, self.content_frames - self.seek)
        if self.windows == 0 and self.first_cut is not None:
            size = min(size, self.first_cut)
        return pad_or_trim(self.features[:, self.seek : self.seek + size]), size

    def begin(self, model: WhisperModel, language: str) -> None:
        """Fix the language (given or detected) once the first window is encoded."""
        self.options = self.options.with_language(language)
        self.tokenizer = Tokenizer(
            model.hf_tokenizer, model.model.is_multilingual, self.options.task, language
        )
        self.opts = transcription_options(self.options, self.tokenizer)

    def context(self, context_tokens: int) -> list[int]:
        """The previous text this window is conditioned on: the initial prompt (up to
        half the model's context) for the first window, then the last `context_tokens`
        tokens of the text so far (0: none)."""
        limit = context_tokens if self.windows else MAX_PROMPT_TOKENS
        previous = self.tokens[self.prompt_from :]
        return previous[-limit:] if limit > 0 else []


def decode_step(
    model: WhisperModel, streams: list[Stream], context_tokens: int
) -> list[list[Segment]]:
    """Decode the next window of every stream; returns each stream's new segments.

    CTranslate2 batches prompts only where the start token sits at the same position, so
    streams go in groups of equal context length (with `context_tokens` set, most streams
    have exactly that many after their first window). A stream that wants word timestamps
    runs alone: the aligner takes one file at a time."""
    groups: dict[tuple[str, int], list[Stream]] = {}
    for stream in streams:
        if stream.options.word_timestamps:
            key = ("alone", id(stream))
        else:
            key = ("context", len(stream.context(context_tokens)))
        groups.setdefault(key, []).append(stream)
    found: dict[int, list[Segment]] = {}
    for group in groups.values():
        contexts = [s.context(context_tokens) for s in group]
        for stream, segments in zip(group, _step(model, group, contexts), strict=True):
            found[id(stream)] = segments
    return [found[id(s)] for s in streams]


def _step(
    model: WhisperModel, streams: list[Stream], contexts: list[list[int]]
) -> list[list[Segment]]:
    windows = [s.window() for s in streams]
    features = np.stack([w[0] for w in windows])
    encoded = model.encode(features)
    _begin_new(model, streams, encoded)
    prompts = [_prompt(model, s, c) for s, c in zip(streams, contexts, strict=True)]
    results = _generate_with_fallback(model, encoded, features, prompts, streams)
    return [
        _advance(model, s, size, result, encoded)
        for s, (_, size), result in zip(streams, windows, results, strict=True)
    ]


def _prompt(model: WhisperModel, stream: Stream, context: list[int]) -> list[int]:
    assert stream.tokenizer is not None
    return list(model.get_prompt(stream.tokenizer, context))


def _begin_new(model: WhisperModel, streams: list[Stream], encoded: Any) -> None:
    new = [i for i, s in enumerate(streams) if s.tokenizer is None]
    multilingual = model.model.is_multilingual
    detect = multilingual and any(streams[i].options.language is None for i in new)
    detected = model.model.detect_language(encoded) if detect else []
    for i in new:
        stream = streams[i]
        language = stream.options.language if multilingual else "en"
        if language is None:
            token, stream.language_probability = detected[i][0]
            language = token[2:-2]
        stream.begin(model, language)


def _generate_with_fallback(
    model: WhisperModel,
    encoded: Any,
    features: np.ndarray,
    prompts: list[list[int]],
    streams: list[Stream],
) -> list[Decoded]:
    """`WhisperModel.generate_with_fallback` for a batch: each temperature of the ladder
    is one generate call over the windows that still need a retry."""
    tried: list[list[Decoded]] = [[] for _ in streams]
    final: dict[int, Decoded] = {}
    pending = list(range(len(streams)))
    temperatures = streams[0].options.temperatures
    for temperature in temperatures:
        if not pending:
            break
        if len(pending) < len(streams):  # a retry: encode again only what needs it
            encoded = model.encode(features[pending])
        sub = [streams[i] for i in pending]
        results = _generate(model, encoded, [prompts[i] for i in pending], sub, temperature)
        still: list[int] = []
        for i, result in zip(pending, results, strict=True):
            tried[i].append(result)
            opts = streams[i].opts
            assert opts is not None
            if result.needs_fallback(opts):
                still.append(i)
            else:
                final[i] = result
        pending = still
    for i in pending:  # every temperature failed: the best try, as faster-whisper does
        opts = streams[i].opts
        assert opts is not None
        final[i] = Decoded.best(tried[i], opts, temperatures[-1])
    return [final[i] for i in range(len(streams))]


class Search(TypedDict, total=False):
    """CTranslate2's search options of one generate call: sampling, or beam search."""

    beam_size: int
    num_hypotheses: int
    sampling_topk: int
    sampling_temperature: float
    patience: float


def _generate(
    model: WhisperModel,
    encoded: Any,
    prompts: list[list[int]],
    streams: list[Stream],
    temperature: float,
) -> list[Decoded]:
    opts = streams[0].opts
    assert opts is not None
    if temperature > 0:
        kwargs: Search = {
            "beam_size": 1,
            "num_hypotheses": opts.best_of,
            "sampling_topk": 0,
            "sampling_temperature": temperature,
        }
    else:
        kwargs = {"beam_size": opts.beam_size, "patience": opts.patience}
    results = model.model.generate(
        encoded,
        prompts,
        length_penalty=opts.length_penalty,
        repetition_penalty=opts.repetition_penalty,
        no_repeat_ngram_size=opts.no_repeat_ngram_size,
        max_length=model.max_length,
        return_scores=True,
        return_no_speech_prob=True,
        suppress_blank=opts.suppress_blank,
        suppress_tokens=opts.suppress_tokens,
        max_initial_timestamp_index=round(opts.max_initial_timestamp / model.time_precision),
        **kwargs,
    )
    return [
        decoded_from(result, s.tokenizer, temperature, opts.length_penalty)
        for s, result in zip(streams, results, strict=True)
    ]


def _advance(
    model: WhisperModel, stream: Stream, size: int, decoded: Decoded, encoded: Any
) -> list[Segment]:
    """Move the stream past its window; the window's segments (`generate_segments`)."""
    assert stream.tokenizer is not None and stream.opts is not None
    stream.windows += 1
    window_seek = stream.seek
    if decoded.is_silence(stream.opts):
        stream.seek += size
        return []
    segments, stream.seek, single_ending = model._split_segments_by_timestamps(
        tokenizer=stream.tokenizer,
        tokens=decoded.tokens,
        time_offset=window_seek / FRAMES_PER_SECOND,
        segment_size=size,
        segment_duration=size / FRAMES_PER_SECOND,
        seek=window_seek,
    )
    if stream.opts.word_timestamps and segments:
        _add_words(model, stream, segments, encoded, size, single_ending, window_seek)
    out: list[Segment] = []
    for segment in segments:
        text = stream.tokenizer.decode(segment["tokens"])
        if segment["start"] == segment["end"] or not text.strip():
            continue
        stream.tokens += segment["tokens"]
        window_end_s = (window_seek + size) / FRAMES_PER_SECOND
        out.append(decoded.segment(stream.next_id, window_seek, segment, text, window_end_s))
        stream.next_id += 1
    if decoded.temperature > stream.opts.prompt_reset_on_temperature:
        stream.prompt_from = len(stream.tokens)
    return out


def _add_words(
    model: WhisperModel,
    stream: Stream,
    segments: list[RawSegment],
    encoded: Any,
    size: int,
    single_ending: bool,
    window_seek: int,
) -> None:
    """Word timings of one stream's window, and the seek they imply (as faster-whisper)."""
    assert stream.tokenizer is not None and stream.opts is not None
    model.add_word_timestamps(
        [segments],
        stream.tokenizer,
        encoded,
        size,
        stream.opts.prepend_punctuations,
        stream.opts.append_punctuations,
        last_speech_timestamp=stream.last_speech_s,
    )
    ends = [w["end"] for s in segments for w in s.get("words") or []]
    last_end = ends[-1] if ends else segments[-1]["end"]
    stream.last_speech_s = last_end
    if not single_ending and last_end > window_seek / FRAMES_PER_SECOND:
        stream.seek = round(last_end * FRAMES_PER_SECOND)
