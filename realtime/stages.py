"""A voice turn's stages as mmq jobs: each stage is a job of its kind (ASR, LLM, TTS),
submitted through the API's job service and followed by its events, so it runs on that
kind's pinned workers, batched with every other job, under the key's quotas and fair share.

A job whose worker dies runs again (its lease expires, the reaper queues it) and streams its
partial outputs again from the start. A stage hands on each piece once
(`jobs.delivery.Delivered`), so the session hears one answer.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import JsonValue

from jobs.delivery import Delivered
from jobs.errors import MmqError
from jobs.models import Event, EventType, Job, JobCreate
from jobs.states import JobStatus

Batches = AsyncGenerator[list[Event] | None, None]


class Jobs(Protocol):
    """What a session needs of the API's job service (`api.service.JobService`)."""

    async def submit_following(self, owner: str, body: JobCreate) -> tuple[Job, Batches]: ...

    async def cancel(self, owner: str, job_id: str) -> Job: ...


StoreAudio = Callable[[str, bytes], Awaitable[str]]
"""Stores a turn's audio (a WAV file) for `owner`; returns its file key."""


class StageFailed(Exception):
    """A stage's job ended other than succeeded: `code` and `message` say why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Followed:
    """A stage job's events, attempt by attempt."""

    job: Job
    events: Batches
    delivered: Delivered = field(default_factory=Delivered)
    output: dict[str, JsonValue] | None = None
    attempts: int = 1

    async def pieces(self) -> AsyncIterator[Event]:
        """Each partial event; then the output is in `output`. StageFailed when the job
        ends other than succeeded."""
        ran = False
        async for batch in self.events:
            for event in batch or ():
                if event.type is EventType.PARTIAL:
                    ran = True
                    yield event
                elif event.type is EventType.OUTPUT:
                    self.output = event.data
                elif event.type is EventType.STATUS:
                    status = JobStatus(event.data["status"])
                    if status is JobStatus.QUEUED and ran:  # its worker died: again
                        ran = False
                        self.attempts += 1
                        self.delivered.new_attempt()
                    elif status.terminal and status is not JobStatus.SUCCEEDED:
                        error = event.data.get("error") or {}
                        raise StageFailed(
                            str(error.get("type") or status.value),
                            str(error.get("message") or f"the {self.job.kind} job {status.value}"),
                        )
        if self.output is None:
            raise StageFailed("stage_lost", f"the {self.job.kind} job ended without an output")


async def submit(jobs: Jobs, owner: str, body: JobCreate) -> Followed:
    job, events = await jobs.submit_following(owner, body)
    return Followed(job, events)


async def cancel_quietly(jobs: Jobs, owner: str, job: Job) -> None:
    """Cancel a stage's job that is no longer wanted (it may have ended meanwhile)."""
    with contextlib.suppress(MmqError):
        await jobs.cancel(owner, job.id)


def pcm_of(data: dict[str, JsonValue]) -> bytes:
    """The PCM16 of a TTS partial (`jobs.outputs.TtsChunk`)."""
    return base64.b64decode(str(data["audio"]))
