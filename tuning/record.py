"""`mmq record`: the jobs a live deployment accepts, written as a workload for `mmq tune`.

It listens on the events channel that every accepted job's `queued` event is published
on, reads each new job's record, and writes one JSONL line a job:
`{"kind", "pipeline", "input", "priority", "at"}` (`at`: seconds since the first job
recorded, so the arrival pattern is kept). A file an input names (an uploaded key, an
http(s) or s3:// URL) is copied once into `<OUT stem>-files/` beside the file and
named `@<path>` in the line, which is how a workload file names a local upload: the
tune's private deployment has its own storage.

Only jobs accepted while it listens are recorded (pub/sub keeps no history). Job inputs
are your users' data: the file is written for the operator who runs it, mode 0600.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from pydantic import JsonValue

from common.redis_client import connect
from jobs.errors import InputError
from jobs.filerefs import file_ref_fields
from jobs.models import EventType, Job
from jobs.schemas import schema_for
from jobs.settings import Settings
from jobstore import notices
from jobstore.job_lookup import JobLookup
from storage.factory import make_storage
from storage.fetch import InputFetcher
from tuning.workload import UPLOAD_PREFIX

log = logging.getLogger(__name__)

POLL_S = 0.5


class RecordedLine(TypedDict):
    """One job of a workload file (`tuning.workload`)."""

    kind: str
    pipeline: str
    input: dict[str, JsonValue]
    priority: str
    at: float
    """Seconds since the first job recorded."""


@dataclass
class Recorded:
    written: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    """Job id -> why it was not written (its input file could not be read...)."""
    ignored: int = 0
    """Jobs of other kinds or pipelines."""


class Recorder:
    """Writes accepted jobs of `kind` (and `pipeline`, if given) to `out`."""

    def __init__(self, settings: Settings, out: Path, *, kind: str | None, pipeline: str | None):
        self.settings = settings
        self.out = out
        self.kind = kind
        self.pipeline = pipeline
        self.files = out.parent / f"{out.stem}-files"
        self.fetcher = InputFetcher(settings, make_storage(settings))
        self.copied: dict[str, str] = {}
        """A file reference -> its copy's name as a workload names it (`@...`)."""
        self.first_at: float | None = None
        self.seen: set[str] = set()
        """Jobs recorded: a job queued again (after its worker died) is not a new job."""
        self.result = Recorded()

    def wants(self, job: Job) -> bool:
        return (self.kind is None or job.kind == self.kind) and (
            self.pipeline is None or job.pipeline == self.pipeline
        )

    def line(self, job: Job) -> RecordedLine:
        """The job's workload line (raises InputError when an input file cannot be read)."""
        self.seen.add(job.id)
        if self.first_at is None:
            self.first_at = job.created_at
        job_input: dict[str, JsonValue] = dict(job.input)
        for name in file_ref_fields(schema_for(job.kind, self.settings)):
            ref = job_input.get(name)
            if isinstance(ref, str) and ref:
                job_input[name] = self._copy(job, name, ref)
        return {
            "kind": job.kind,
            "pipeline": job.pipeline,
            "input": job_input,
            "priority": job.priority,
            "at": round(job.created_at - self.first_at, 3),
        }

    def _copy(self, job: Job, name: str, ref: str) -> str:
        if ref not in self.copied:
            self.files.mkdir(parents=True, exist_ok=True)
            suffix = Path(ref.split("?")[0]).suffix[:11]
            local = self.files / f"{len(self.copied):05d}-{name}{suffix}"
            source = self.fetcher.open(ref, owner=job.owner, field=f"input.{name}")
            with source as src, local.open("wb") as out:
                shutil.copyfileobj(src, out)
            local.chmod(0o600)
            self.copied[ref] = f"{UPLOAD_PREFIX}{self.files.name}/{local.name}"
        return self.copied[ref]


def record(
    settings: Settings,
    out: Path,
    *,
    kind: str | None = None,
    pipeline: str | None = None,
    duration_s: float | None = None,
    max_jobs: int | None = None,
    on_line: Callable[[RecordedLine], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> Recorded:
    """Record until `duration_s` passes, `max_jobs` are written or `stop()` says so."""
    recorder = Recorder(settings, out, kind=kind, pipeline=pipeline)
    client = connect(str(settings.redis_url))
    jobs = JobLookup(client)
    pubsub = notices.listen(client, "events")
    deadline = time.monotonic() + duration_s if duration_s else None
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        with os.fdopen(fd, "a") as sink, contextlib.suppress(KeyboardInterrupt):
            while not stop() and (deadline is None or time.monotonic() < deadline):
                if max_jobs is not None and recorder.result.written >= max_jobs:
                    break
                message = pubsub.get_message(timeout=POLL_S)
                if message is None:
                    continue
                for job_id in _queued(str(message["data"])):
                    job = jobs.get(job_id)
                    if job is None:
                        continue  # ended and expired already
                    if job.id in recorder.seen:
                        continue
                    if not recorder.wants(job):
                        recorder.result.ignored += 1
                        continue
                    try:
                        line = recorder.line(job)
                    except (InputError, OSError) as exc:
                        recorder.result.skipped[job.id] = str(exc)
                        log.warning("job %s not recorded: %s", job.id, exc)
                        continue
                    sink.write(json.dumps(line, separators=(",", ":")) + "\n")
                    sink.flush()
                    recorder.result.written += 1
                    if on_line is not None:
                        on_line(line)
                    if max_jobs is not None and recorder.result.written >= max_jobs:
                        break
    finally:
        pubsub.close()
        client.close()
    return recorder.result


def _queued(raw: str) -> list[str]:
    """The ids of the jobs whose `queued` event a message of the events channel carries."""
    events = [notices.event_of(line) for line in notices.event_lines(raw)]
    return [
        e.job_id for e in events if e.type is EventType.STATUS and e.data.get("status") == "queued"
    ]
