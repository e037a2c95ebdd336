"""The jobs a tune sends, and when.

A workload is a list of job inputs of the pipeline's kind: from a JSONL file (one job a
line: `{"input": {...}}`, a whole `/v1/jobs` body, or a bare input; an ASR input's
`"audio": "@clip.wav"` names a local file the tune uploads once), from `--input JSON`,
or built in (ASR clips of given lengths spoken by the packaged Piper voice, TTS texts of
given sentence counts, LLM prompts of given input and output token lengths, image sizes
and steps). Every input is validated with the kind's schema before anything starts.

Arrival is a closed loop at each `--concurrency` level, or Poisson at each `--rate`
(requests per second). Every candidate gets the same jobs in the same order at the same
offsets: both are drawn from `--seed`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from pydantic import JsonValue, ValidationError

from jobs.schemas import schema_for, validation_error_field
from jobs.settings import Settings

UPLOAD_PREFIX = "@"
SENTENCES = (
    "The meeting starts at nine in the morning.",
    "Please bring the report from last week.",
    "We will talk about the budget and the new office.",
    "Lunch is served at noon in the hall.",
    "Everyone should be home before six in the evening.",
    "The train to the coast leaves every hour on the hour.",
    "Her garden has roses, tulips and a small apple tree.",
    "Turn left at the bakery and walk two more blocks.",
)
WORDS_PER_TOKEN = 0.75
"""About how many English words an LLM token is, to size built-in prompts."""


class WorkloadError(ValueError):
    """Jobs that cannot be sent: every bad line, with its number and reason."""


@dataclass
class Workload:
    kind: str
    inputs: list[dict[str, JsonValue]]
    uploads: dict[str, Path]
    """`@name` in an input -> the local file uploaded in its place."""
    describe: str
    arrivals: list[float] | None = None
    """Each job's recorded offset in seconds (`"at"`, as `mmq record` writes), where
    every line of the file has one: what `--replay` sends them at."""


@dataclass(frozen=True)
class Level:
    """One load level: `concurrency` clients in a closed loop, Poisson at `rate`/s, or a
    recorded workload's own arrivals replayed `speed` times as fast."""

    concurrency: int | None = None
    rate: float | None = None
    requests: int = 0
    speed: float | None = None
    arrivals: tuple[float, ...] = ()
    """Replay: each recorded job's offset (s) from the first, in the workload's order."""

    def __str__(self) -> str:
        if self.speed:
            return f"replay x{self.speed:g}"
        return f"c={self.concurrency}" if self.concurrency else f"{self.rate:g}/s"

    @property
    def load(self) -> float:
        return float(self.concurrency or self.rate or self.speed or 0)


def levels(
    concurrency: Sequence[int],
    rates: Sequence[float],
    requests: int | None,
    speeds: Sequence[float] = (),
    arrivals: Sequence[float] = (),
) -> list[Level]:
    """The load levels, lightest first; `requests` per level (default: enough to fill it,
    or for a replay the whole recording)."""
    if speeds:
        return [
            Level(speed=s, arrivals=tuple(arrivals), requests=requests or len(arrivals))
            for s in sorted(speeds)
        ]
    if rates:
        return [Level(rate=r, requests=requests or max(8, round(r * 10))) for r in sorted(rates)]
    return [Level(concurrency=c, requests=requests or max(8, 4 * c)) for c in sorted(concurrency)]


def schedule(level: Level, count: int, seed: int) -> tuple[list[int], list[float]]:
    """Which input each request of the level sends (indices into the workload), and for
    an open-loop level each request's start offset in seconds; the same for every
    candidate. A replay sends the recorded jobs in order at their recorded offsets (sped
    up), starting the recording again after its end where more requests are asked for."""
    if level.speed:
        last = level.arrivals[-1]
        span = last + (last / (count - 1) if count > 1 and last > 0 else 1.0)
        order = [i % count for i in range(level.requests)]
        replayed = [
            (level.arrivals[i % count] + i // count * span) / level.speed
            for i in range(level.requests)
        ]
        return order, replayed
    rng = random.Random(f"{seed}:{level}")
    order = [rng.randrange(count) for _ in range(level.requests)]
    offsets: list[float] = []
    if level.rate:
        at = 0.0
        for _ in range(level.requests):
            offsets.append(at)
            at += rng.expovariate(level.rate)
    return order, offsets


def from_file(path: Path, kind: str, settings: Settings) -> Workload:
    if not path.is_file():
        raise WorkloadError(f"workload file {path} does not exist")
    inputs: list[tuple[str, dict[str, JsonValue]]] = []
    errors: list[str] = []
    arrivals: list[float] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            parsed = json.loads(line)
            inputs.append((f"line {number}", _job_input(parsed, kind, path.parent)))
            at = parsed.get("at")
            if isinstance(at, int | float) and not isinstance(at, bool) and at >= 0:
                arrivals.append(float(at))
        except json.JSONDecodeError as exc:
            errors.append(f"line {number}: not JSON ({exc.msg})")
        except WorkloadError as exc:
            errors.append(f"line {number}: {exc}")
    workload = _checked(kind, inputs, errors, settings, f"{path.name} ({len(inputs)} jobs)", path)
    if len(arrivals) == len(inputs):
        start = min(arrivals)
        workload.arrivals = [at - start for at in arrivals]
    return workload


def from_inputs(texts: Sequence[str], kind: str, settings: Settings) -> Workload:
    inputs: list[tuple[str, dict[str, JsonValue]]] = []
    errors: list[str] = []
    for number, text in enumerate(texts, start=1):
        try:
            inputs.append((f"--input {number}", _job_input(json.loads(text), kind, Path.cwd())))
        except json.JSONDecodeError as exc:
            errors.append(f"--input {number}: not JSON ({exc.msg})")
        except WorkloadError as exc:
            errors.append(f"--input {number}: {exc}")
    return _checked(kind, inputs, errors, settings, f"{len(inputs)} --input job(s)", None)


def built_in(kind: str, settings: Settings, spec: BuiltIn, workdir: Path) -> Workload:
    """The kind's built-in jobs (raises WorkloadError for a kind that has none)."""
    inputs: list[dict[str, JsonValue]]
    if kind == "tts":
        inputs = [
            {"text": _sentences(n, i), "format": "pcm"} for i, n in enumerate(spec.tts_sentences)
        ]
        describe = f"TTS texts of {_list(spec.tts_sentences)} sentence(s)"
    elif kind == "llm":
        inputs = [
            {"prompt": _prompt(n_in, i), "max_tokens": n_out, "temperature": 0.0, "cache": False}
            for i, (n_in, n_out) in enumerate(spec.llm_lengths)
        ]
        describe = (
            "LLM prompts of " + ", ".join(f"{a}->{b}" for a, b in spec.llm_lengths) + " tokens"
        )
    elif kind == "image":
        inputs = [
            {
                "prompt": "a lighthouse on a cliff at dusk",
                "width": w,
                "height": h,
                "steps": s,
                "seed": 7,
            }
            for w, h, s in spec.image_shapes
        ]
        describe = "images " + ", ".join(f"{w}x{h}@{s}" for w, h, s in spec.image_shapes)
    elif kind == "embed":
        inputs = [
            {"input": [_sentences(1, i * spec.embed_texts + j) for j in range(spec.embed_texts)]}
            for i in range(4)
        ]
        describe = f"embedding requests of {spec.embed_texts} sentence(s)"
    elif kind == "rerank":
        inputs = [
            {
                "query": _sentences(1, i),
                "documents": [
                    _sentences(1, i * spec.embed_texts + j) for j in range(spec.embed_texts)
                ],
            }
            for i in range(4)
        ]
        describe = f"rerank requests of {spec.embed_texts} document(s)"
    elif kind == "asr":
        uploads = {
            f"clip{i}": speech_clip(seconds, workdir) for i, seconds in enumerate(spec.asr_seconds)
        }
        inputs = [{"audio": f"{UPLOAD_PREFIX}{name}"} for name in uploads]
        checked = _checked(kind, _numbered(inputs), [], settings, "", None)
        checked.uploads = uploads
        checked.describe = f"ASR clips of {_list(spec.asr_seconds)} s (Piper speech)"
        return checked
    else:
        raise WorkloadError(
            f"kind {kind!r} has no built-in workload: give --workload FILE or --input JSON"
        )
    return _checked(kind, _numbered(inputs), [], settings, describe, None)


@dataclass
class BuiltIn:
    asr_seconds: Sequence[float] = (10.0,)
    tts_sentences: Sequence[int] = (3,)
    llm_lengths: Sequence[tuple[int, int]] = ((128, 64),)
    image_shapes: Sequence[tuple[int, int, int]] = ((512, 512, 20),)
    embed_texts: int = 8
    """Texts of an embedding request, and documents of a rerank request."""


def speech_clip(seconds: float, workdir: Path) -> Path:
    """A WAV of about `seconds` of English speech, spoken by the packaged Piper voice."""
    import wave

    try:
        from piper import PiperVoice

        from pipelines.tts.piper import default_voice_paths
    except ImportError as exc:
        raise WorkloadError(
            f"built-in ASR clips are spoken by Piper, which is not installed ({exc}); "
            "give --workload FILE with your own audio"
        ) from None
    path = workdir / f"speech-{seconds:g}s.wav"
    if path.exists():
        return path
    model, config = default_voice_paths()
    voice = PiperVoice.load(model, config_path=config)
    pcm, rate, i = bytearray(), 22050, 0
    while len(pcm) / 2 / rate < seconds:
        for chunk in voice.synthesize(SENTENCES[i % len(SENTENCES)]):
            rate = chunk.sample_rate
            pcm += chunk.audio_int16_bytes
        i += 1
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(pcm[: int(seconds * rate) * 2]))
    return path


def _job_input(line: Any, kind: str, base: Path) -> dict[str, JsonValue]:
    if not isinstance(line, dict):
        raise WorkloadError("a job is a JSON object")
    if "kind" in line and line["kind"] != kind:
        raise WorkloadError(f"kind {line['kind']!r}, but the pipeline serves {kind!r}")
    job = line.get("input", line if "kind" not in line else None)
    if not isinstance(job, dict):
        raise WorkloadError('no "input" object')
    for name, value in job.items():
        if isinstance(value, str) and value.startswith(UPLOAD_PREFIX):
            local = (base / value[1:]).resolve()
            if not local.is_file():
                raise WorkloadError(f"input.{name}: no file {local}")
            job = {**job, name: f"{UPLOAD_PREFIX}{local}"}
    return dict(job)


def _checked(
    kind: str,
    inputs: list[tuple[str, dict[str, JsonValue]]],
    errors: list[str],
    settings: Settings,
    describe: str,
    source: Path | None,
) -> Workload:
    """The inputs (each with where it came from) validated with the kind's schema; raises
    WorkloadError naming every bad one."""
    schema = schema_for(kind, settings)
    for where, job in inputs:
        probe = {k: ("x" if _is_upload(v) else v) for k, v in job.items()}
        try:
            schema.model_validate(probe)
        except ValidationError as exc:
            bad = validation_error_field(exc, "input")
            errors.append(f"{where}: {bad.field}: {bad.reason}")
    if errors:
        where = f"{source}: " if source else ""
        raise WorkloadError(where + "invalid jobs:\n  " + "\n  ".join(errors))
    if not inputs:
        raise WorkloadError("the workload has no jobs")
    jobs = [job for _, job in inputs]
    uploads = {v[1:]: Path(v[1:]) for job in jobs for v in job.values() if _is_upload(v)}
    return Workload(kind, jobs, uploads, describe)


def _is_upload(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and value.startswith(UPLOAD_PREFIX)


def _numbered(inputs: list[dict[str, JsonValue]]) -> list[tuple[str, dict[str, JsonValue]]]:
    return [(f"built-in job {n}", job) for n, job in enumerate(inputs, start=1)]


def _sentences(count: int, start: int) -> str:
    return " ".join(SENTENCES[(start + i) % len(SENTENCES)] for i in range(count))


def _prompt(tokens: int, start: int) -> str:
    words: list[str] = []
    i = start
    while len(words) < tokens * WORDS_PER_TOKEN:
        words += SENTENCES[i % len(SENTENCES)].split()
        i += 1
    return " ".join(words[: max(1, round(tokens * WORDS_PER_TOKEN))])


def _list(values: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in values)
