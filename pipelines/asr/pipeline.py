"""The ASR pipeline: faster-whisper, segments streamed, windows batched across requests.

Config (`[pipelines.NAME]`): `model` (a hub id or a CTranslate2 directory; empty: the
packaged tiny.en), `device`, and `options`:

- `compute_type`: int8 on CPU, float16 on GPU by default.
- `cpu_threads`, `num_workers`: CTranslate2's threads per call and calls at once. With
  the engine's `runners` = `num_workers`, that many batches decode in parallel.
- `first_window_s` (6): the first window of a file longer than one window (30 s) ends at
  a pause near this second, so that its first segments come out early; 0 turns it off.
- `context_tokens` (32): previous-text tokens each window is conditioned on; a fixed
  number lets windows of different requests share a generate call (0: none).

The engine's `max_batch` is how many requests decode in lockstep (one window each per
forward pass); 1 decodes each request alone. `prepare` decodes each request's audio
before its batch runs. Timing: `first_segment_ms`, from the start of the batch's
decoding to the request's first segment.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from jobs.outputs import AsrOutput, Segment
from jobs.schemas.asr import AsrInput, AsrOptions
from pipelines.asr.batch import decode_step
from pipelines.asr.decode import SAMPLE_RATE, decode_file
from pipelines.asr.model import load_model, spec_from_config
from pipelines.asr.options import DecodeOptions
from pipelines.asr.prepare import Prepared
from pipelines.asr.prepare import prepare as prepare_stream
from pipelines.base import Pipeline, Request


@dataclass(eq=False)
class Decoding:
    """A request being decoded, and the segments it has so far."""

    request: Request[AsrInput]
    prepared: Prepared
    batch_size: int = 1
    """Requests of the batch it decoded in (1: alone)."""
    segments: list[Segment] = field(default_factory=list)

    def add(self, segment: Segment, started: float) -> None:
        """Keep a decoded segment and send it out; the first one's time is a timing."""
        if not self.segments:
            self.request.record_timing("first_segment_ms", (time.monotonic() - started) * 1000)
        self.segments.append(self.prepared.restore(segment))
        self.request.partial({"segment": self.segments[-1]})

    def output(self) -> AsrOutput:
        stream = self.prepared.stream
        return {
            "text": "".join(s["text"] for s in self.segments).strip(),
            "language": stream.options.language,
            "language_probability": round(stream.language_probability, 4),
            "duration": round(self.prepared.duration_s, 3),
            "segments": self.segments,
            "batch_size": self.batch_size,
        }


class AsrPipeline(Pipeline[AsrInput, Decoding]):
    kind = "asr"

    def load(self) -> None:
        options = self.config.options_as(AsrOptions)
        self.spec = spec_from_config(self.config)
        self.model = load_model(self.spec)
        self.first_window_s = options.first_window_s
        self.context_tokens = options.context_tokens

    def unload(self) -> None:
        del self.model  # CTranslate2 frees the weights with the last reference

    def warmup(self) -> None:
        noise = np.random.default_rng(0).normal(0, 0.01, 2 * SAMPLE_RATE).astype(np.float32)
        stream = prepare_stream(self.model, noise, DecodeOptions(language="en"), 0).stream
        decode_step(self.model, [stream], self.context_tokens)

    def batch_key(self, request: AsrInput) -> Hashable | None:
        options = DecodeOptions.from_input(request)
        return None if options.word_timestamps else options.batch_key()

    def prepare(self, request: Request[AsrInput]) -> Decoding:
        """Decode the request's audio and set up its decoding."""
        inp = request.input
        with request.files.input_path(inp.audio, "audio") as path:
            audio = decode_file(path, self.settings.limits)
        options = DecodeOptions.from_input(inp)
        return Decoding(request, prepare_stream(self.model, audio, options, self.first_window_s))

    def run(self, batch: Sequence[Decoding]) -> None:
        started = time.monotonic()
        jobs = list(batch)
        for job in jobs:
            job.batch_size = len(jobs)
        while jobs := [job for job in jobs if not self._finished(job)]:
            found = decode_step(self.model, [j.prepared.stream for j in jobs], self.context_tokens)
            for job, segments in zip(jobs, found, strict=True):
                for segment in segments:
                    job.add(segment, started)

    @staticmethod
    def _finished(job: Decoding) -> bool:
        """True once the job has ended: decoded to the end (it succeeds) or canceled."""
        if job.request.drop_if_canceled():
            return True
        if job.prepared.stream.done:
            job.request.succeed(job.output())
            return True
        return False
