"""The TTS pipeline: the voices of settings, spoken sentence by sentence as partial events.

Each request runs alone (engines have no batch dimension: no batch key), so bad input
found while speaking (a reference clip that cannot be read) fails only its request; a
device runs several engine instances as separate worker processes (`instances`). For one
request:

1. `prepare` resolves the voice from the pipeline's `options.voices` (unknown: invalid
   input) and splits the text into sentences (`pipelines.tts.text`);
2. each sentence is synthesized in order; every chunk an engine yields goes out at once
   as a `partial` event `{seq, sentence, text, sample_rate, samples, audio}` (`audio`:
   base64 little-endian PCM16 mono), plus `stream` (base64, the next bytes of the
   requested format's stream) for flac, mp3 and opus; a `progress` event follows each
   sentence; a cancel stops before the next sentence (or the next XTTS chunk);
3. the whole audio is encoded in the requested format and stored; the output names it.

Timings: `first_audio_ms` (start of synthesis to the first chunk with audio) and
`synthesis_ms` (to the last chunk).
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jobs.errors import InputError
from jobs.outputs import TtsChunk, TtsOutput, TtsSummary
from jobs.schemas.tts import TtsInput, TtsOptions
from jobs.settings import PipelineConfig, Settings
from pipelines.base import Pipeline, Request
from pipelines.tts.encode import (
    FORMATS,
    STREAMED_FORMATS,
    Shaper,
    StreamEncoder,
    encode_file,
)
from pipelines.tts.engines import SpeakOptions, SpeechEngine
from pipelines.tts.text import split_sentences
from pipelines.tts.voices import make_engine


@dataclass(frozen=True)
class Plan:
    """One request, prepared: its voice, that voice's engine, the sentences to speak."""

    request: Request[TtsInput]
    voice: str
    engine: SpeechEngine
    sentences: list[str]


class TtsPipeline(Pipeline[TtsInput, Plan]):
    kind = "tts"

    def __init__(self, config: PipelineConfig, settings: Settings) -> None:
        super().__init__(config, settings)
        self.options = config.options_as(TtsOptions)
        self.engines: dict[str, SpeechEngine] = {}

    def load(self) -> None:
        for name, spec in self.options.voices.items():
            engine = make_engine(spec, self.config.device, self.options.threads)
            engine.load()
            self.engines[name] = engine

    def warmup(self) -> None:
        for engine in self.engines.values():
            if not engine.clones:  # a cloning voice has nothing to say without a clip
                for _ in engine.speak("Ready.", SpeakOptions()):
                    pass

    def prepare(self, request: Request[TtsInput]) -> Plan:
        """The voice, its engine and the sentences; InputError where they do not fit."""
        inp = request.input
        name = self.options.resolve(inp.voice)
        engine = self.engines[name]
        if inp.reference_audio and not engine.clones:
            raise InputError("reference_audio", f"voice {name!r} does not clone voices")
        limit = self.options.max_sentence_chars
        engine_limit = engine.sentence_limit(inp.language) or limit
        sentences = split_sentences(inp.text, min(limit, engine_limit))
        if not sentences:
            raise InputError("text", "has nothing to speak")
        return Plan(request, name, engine, sentences)

    def run(self, batch: Sequence[Plan]) -> None:
        for plan in batch:  # a batch of one: no batch key
            self._speak(plan)

    def unload(self) -> None:
        for engine in self.engines.values():
            engine.unload()
        self.engines.clear()

    def _speak(self, plan: Plan) -> None:
        request, engine = plan.request, plan.engine
        inp = request.input
        with _reference(request) as reference:
            options = SpeakOptions(
                speed=inp.speed if engine.native_speed else 1.0,
                language=inp.language,
                reference=reference,
            )
            audio = _Speech(request, engine).run(plan.sentences, options)
        if audio is None:
            return  # canceled
        spec = FORMATS[inp.format]
        data = encode_file(audio.samples(), audio.rate, inp.format)
        stored = request.files.put_output(f"speech.{spec.extension}", data, spec.content_type)
        output: TtsOutput = {"audio": stored, **audio.summary(plan.voice, len(plan.sentences))}
        request.succeed(output)


@contextlib.contextmanager
def _reference(request: Request[TtsInput]) -> Iterator[Path | None]:
    ref = request.input.reference_audio
    if ref is None:
        yield None
        return
    with request.files.input_path(ref, "reference_audio") as path:
        yield path


class _Speech:
    """One request's synthesis: sentences in, partial events out, the audio kept."""

    def __init__(self, request: Request[TtsInput], engine: SpeechEngine) -> None:
        inp = request.input
        self.request = request
        self.format = inp.format
        self.engine = engine
        self.rate = inp.sample_rate or engine.sample_rate
        tempo = 1.0 if engine.native_speed else inp.speed
        self.shaper = Shaper(engine.sample_rate, self.rate, tempo)
        streamed = inp.format in STREAMED_FORMATS
        self.encoder = StreamEncoder(inp.format, self.rate) if streamed else None
        self.chunks: list[np.ndarray] = []
        self.seq = 0
        self.total = 0
        self._started = time.monotonic()

    def run(self, sentences: list[str], options: SpeakOptions) -> _Speech | None:
        """Speak every sentence; None when the request was canceled on the way."""
        for index, sentence in enumerate(sentences):
            for chunk in self.engine.speak(sentence, options):
                if self.request.drop_if_canceled():
                    return None
                self._emit(self.shaper.feed(chunk), index, sentence)
            if self.request.drop_if_canceled():
                return None
            self.request.progress(index + 1, len(sentences))
        tail = self.shaper.flush()
        self._emit(tail, len(sentences) - 1, "", closing=True)
        self._record("synthesis_ms")
        return self

    def summary(self, voice: str, sentences: int) -> TtsSummary:
        """The job's output, beside the stored file."""
        return {
            "format": self.format,
            "sample_rate": self.rate,
            "duration_s": round(self.total / self.rate, 3),
            "voice": voice,
            "engine": self.engine.engine,
            "sentences": sentences,
            "chunks": self.seq,
            "worker_pid": os.getpid(),
        }

    def samples(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int16)

    def _emit(self, samples: np.ndarray, sentence: int, text: str, closing: bool = False) -> None:
        stream = self.encoder.feed(samples) if self.encoder else b""
        if closing and self.encoder:
            stream += self.encoder.close()
        if not samples.size and not stream:
            return
        self.chunks.append(samples)
        self.total += samples.size
        data: TtsChunk = {
            "seq": self.seq,
            "sentence": sentence,
            "text": text,
            "sample_rate": self.rate,
            "samples": int(samples.size),
            "audio": base64.b64encode(samples.astype("<i2").tobytes()).decode(),
        }
        if self.encoder:
            data["stream"] = base64.b64encode(stream).decode()
        if samples.size and self.total == samples.size:  # the first chunk with audio
            self._record("first_audio_ms")
        self.request.partial(data)
        self.seq += 1

    def _record(self, name: str) -> None:
        self.request.record_timing(name, (time.monotonic() - self._started) * 1000.0)
