"""`mmq submit --follow`: a job's events as a person reads them, or as JSON lines.

Each kind has a `Renderer` (`RENDERERS`): how its partial events read, what its progress
bar counts, and what its output event adds at the end; kinds without one show partials
and output as JSON. Status changes and errors read alike for every kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from jobs.outputs import (
    AsrOutput,
    AsrPartial,
    ImageOutput,
    LlmDelta,
    LlmOutput,
    TtsChunk,
    TtsOutput,
)
from jobs.wire import Event, Job, JobError, ProgressData, StatusData
from mmq.client import Client

if TYPE_CHECKING:
    from pydantic import JsonValue


def _line(console: Console, *parts: str | tuple[str, str]) -> None:
    """One line of plain text (no markup read from job data), never hard-wrapped."""
    console.print(Text.assemble(*parts), soft_wrap=True)


def _json_partial(console: Console, data: dict[str, JsonValue], streamed: int) -> None:
    _line(console, ("partial ", "cyan"), json.dumps(data)[:200])


def _json_output(console: Console, output: dict[str, JsonValue], streamed: int) -> None:
    console.print_json(data=output)


def _asr_segment(console: Console, data: AsrPartial, streamed: int) -> None:
    segment = data.get("segment") or {}
    times = f"[{segment.get('start', 0):7.2f} → {segment.get('end', 0):7.2f}] "
    _line(console, (times, "dim"), str(segment.get("text", "")).strip())


def _asr_output(console: Console, output: AsrOutput, streamed: int) -> None:
    if not streamed:
        _line(console, str(output.get("text", "")))


def _llm_token(console: Console, data: LlmDelta, streamed: int) -> None:
    console.out(str(data.get("text", "")), end="", highlight=False)


def _llm_output(console: Console, output: LlmOutput, streamed: int) -> None:
    # A cached answer comes whole, without partials.
    console.out("" if streamed else str(output.get("text", "")), highlight=False)
    for call in output.get("tool_calls") or []:
        function = call.get("function") or {}
        _line(
            console, ("tool call ", "dim"), f"{function.get('name')}({function.get('arguments')})"
        )


def audio_seconds(data: TtsChunk) -> float:
    """How long a TTS partial's audio plays (its `samples` at its `sample_rate`)."""
    return int(data.get("samples") or 0) / max(1, int(data.get("sample_rate") or 1))


def _tts_chunk(console: Console, data: TtsChunk, streamed: int) -> None:
    seconds_of_audio = audio_seconds(data)
    if not seconds_of_audio:
        return  # the closing bytes of a streamed format, no samples
    number = int(data.get("sentence", 0)) + 1
    text = str(data.get("text") or "…")
    seconds = f"({seconds_of_audio:.1f} s of audio)"
    _line(console, f"sentence {number}: {text} ", (seconds, "dim"))


def _tts_output(console: Console, output: TtsOutput, streamed: int) -> None:
    what = f"{output.get('duration_s')} s of {output.get('format')} audio"
    _line(console, (f"{what}, {output.get('sentences')} sentence(s)", "bold"))


def _image_output(console: Console, output: ImageOutput, streamed: int) -> None:
    images = output.get("images") or []
    size = f"{output.get('width')}x{output.get('height')}"
    _line(console, (f"{len(images)} image(s) {size}, seeds {output.get('seeds')}", "bold"))


Hook = Callable[[Console, "dict[str, JsonValue]", int], None]
"""(console, event data or output, partials shown so far) -> None."""
KindData = TypeVar("KindData")


def _of_kind(hook: Callable[[Console, KindData, int], None]) -> Hook:
    """`hook`, which reads its kind's data (`jobs.wire`), as a hook of the event's JSON."""
    return lambda console, data, streamed: hook(console, cast(KindData, data), streamed)


@dataclass(frozen=True)
class Renderer:
    partial: Hook = _json_partial
    output: Hook = _json_output
    unit: str = "progress"
    """What the progress bar counts."""


RENDERERS: dict[str, Renderer] = {
    "asr": Renderer(_of_kind(_asr_segment), _of_kind(_asr_output)),
    "llm": Renderer(_of_kind(_llm_token), _of_kind(_llm_output)),
    "tts": Renderer(_of_kind(_tts_chunk), _of_kind(_tts_output), "sentences"),
    "image": Renderer(output=_of_kind(_image_output), unit="steps"),
}


@dataclass
class _Follower:
    console: Console
    renderer: Renderer
    streamed: int = 0
    progress: Progress | None = None
    bar: TaskID | None = None

    def on(self, event: Event) -> None:
        """Show one event (one of a type it does not know: nothing)."""
        if event["type"] == "status":
            self.status(event["data"])
        elif event["type"] == "partial":
            self.partial(event["data"])
        elif event["type"] == "progress":
            self.step(event["data"])
        elif event["type"] == "output":
            self.output(event["data"])
        elif event["type"] == "error":
            self.error(event["data"])

    def status(self, data: StatusData) -> None:
        loading = f" (loading {data['loading']})" if data.get("loading") else ""
        _line(self.console, ("status ", "bold"), f"{data.get('status')}{loading}")

    def partial(self, data: dict[str, JsonValue]) -> None:
        self.renderer.partial(self.console, data, self.streamed)
        self.streamed += 1

    def output(self, data: dict[str, JsonValue]) -> None:
        self.stop_bar()
        self.renderer.output(self.console, data, self.streamed)

    def error(self, data: JobError) -> None:
        self.stop_bar()
        where = f" (field {data['field']})" if data.get("field") else ""
        message = f"error {data.get('type', 'error')}: {data.get('message', data)}{where}"
        _line(self.console, (message, "bold red"))

    def step(self, data: ProgressData) -> None:
        if self.progress is None:
            self.progress = _progress(self.console)
            self.progress.start()
            self.bar = self.progress.add_task(self.renderer.unit, total=data.get("total"))
        assert self.bar is not None
        self.progress.update(self.bar, completed=data.get("step", 0), total=data.get("total"))

    def stop_bar(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def follow_job(client: Client, job: Job, console: Console) -> Job:
    """Print the job's events, readably for its kind, until it ends; returns the ended job."""
    follower = _Follower(console, RENDERERS.get(str(job.get("kind")), Renderer()))
    try:
        for event in client.events(job["id"]):
            follower.on(event)
    finally:
        follower.stop_bar()
    return client.get(job["id"])


def follow_json(client: Client, job: Job, write: Callable[[str], None]) -> Job:
    """Write each of the job's events as one JSON line until it ends; returns the ended job."""
    for event in client.events(job["id"]):
        write(json.dumps(event))
    return client.get(job["id"])
