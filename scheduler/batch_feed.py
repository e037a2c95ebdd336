"""Batch feeding: each active batch (oldest first) goes through three steps.

1. **Collect**: each released line whose job has ended moves, once, to the output file's
   lines (it succeeded) or the error file's (it did not), in OpenAI's shape for the
   batch's endpoint (`LineAnswers`, passed in: the API's renderers).
2. **Release**: while the batch is in progress and its window is open, lines are made
   jobs of priority `batch` (`keys.queued_batch`: the 429 bound never counts them), as
   many as their pipeline has room for (`Slots.batch_room`: its live workers' slots, less
   `batches.reserve_slots`, minus the batch lines it already holds, and none while an
   interactive job waits in its queue). The queue stays shallow, so what waits can still
   be reordered, and an interactive job is taken before any released line (priority
   `batch` is kombu's last step). A line's job id is fixed (`Line.job_id`) and taking a
   line off the list is one script that checks it is still the first
   (`BatchStore.take_line`): a crash between the job's submit and that script, or two
   schedulers at once, makes no second job and loses no line.
3. **Finish**: a batch with nothing left to release and nothing in flight writes its two
   files to storage (as OpenAI file objects) and ends: `completed`, or `cancelled` /
   `expired` with every line never released in the error file. A line's job has the
   batch's end as its deadline (`cancel_at_deadline`): past the window, a queued one
   expires and a running one is canceled, so an expired batch ends soon after its window.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Protocol

from celery import Celery

from broker.celery_app import enqueue_webhook, job_message
from jobs.errors import NotDurable
from jobs.models import Job
from jobs.settings import Settings
from jobs.states import JobStatus
from jobstore.batch_records import Batch, BatchStatus, Line, end_event, invalid_line, output_line
from jobstore.batch_store import BatchStore
from jobstore.file_objects import FileObject
from jobstore.store import JobStore
from scheduler.slots import Room
from storage.base import Storage

log = logging.getLogger(__name__)

NO_LIMIT = 2**31
"""The queued-set bound of a batch line's submit: the scheduler is its bound."""
WHY = {"batch_cancelled": "the batch was cancelled", "batch_expired": "the window ended"}


class LineAnswers(Protocol):
    """How an ended line's job reads in the batch's output: its endpoint's answer, as the
    route would have given it (the API's renderers, `api.batch_answers`)."""

    def answer(self, batch: Batch, line: Line, job: Job) -> dict[str, object]: ...

    def failure(self, batch: Batch, job: Job) -> tuple[int, dict[str, object]]: ...


class BatchFeed:
    def __init__(
        self,
        jobs: JobStore,
        batches: BatchStore,
        settings: Settings,
        app: Celery,
        storage: Storage,
        answers: LineAnswers,
    ) -> None:
        self.jobs = jobs
        self.batches = batches
        self.settings = settings
        self.app = app
        self.storage = storage
        self.answers = answers

    def collect(self, batch: Batch) -> None:
        """Collect the released lines whose jobs have ended."""
        for job_id, line in self.batches.ended_lines(batch.id):
            job = self.jobs.get(job_id)
            if job is None:  # its record is gone (deleted by hand): the line failed
                text = invalid_line(batch.id, line.line, line.custom_id, "job_lost",
                                    f"line {line.line}: its job is gone")  # fmt: skip
                succeeded = False
            elif job.status is JobStatus.SUCCEEDED:
                body = self.answers.answer(batch, line, job)
                text = output_line(batch.id, line.line, line.custom_id, 200, body, job.id)
                succeeded = True
            else:
                code, body = self.answers.failure(batch, job)
                text = output_line(batch.id, line.line, line.custom_id, code, body, job.id)
                succeeded = False
            self.batches.collect(batch.id, job_id, text, succeeded=succeeded)

    def feed(self, batch: Batch, room: Room, now: float) -> None:
        """Release its lines while their pipelines have room, then end it if it is done."""
        if batch.status.ended:  # it failed at create: only its webhook is left
            self._notify(batch.id)
            self.batches.deactivate(batch.id)
            return
        if batch.status is BatchStatus.IN_PROGRESS and now < batch.expires_at:
            self._release_lines(batch, room)
        self._finish_if_done(batch, now)

    def _release_lines(self, batch: Batch, room: Room) -> None:
        while (first := self.batches.first_waiting(batch.id)) is not None:
            raw, line = first
            if not room.take(line.pipeline):
                return  # in file order: a line waits for its own pipeline's room
            job = self._job(batch, line)
            try:
                self.jobs.submit(job, job_message(self.app, job), NO_LIMIT)
            except NotDurable as exc:  # stored: its line is taken, as for any other
                log.warning("batch %s: line %d: %s", batch.id, line.line, exc)
            self.batches.take_line(batch.id, raw, job.id)

    def _job(self, batch: Batch, line: Line) -> Job:
        now = time.time()
        metadata = {**line.job.get("metadata", {}), "batch_id": batch.id}
        metadata["batch_custom_id"] = line.custom_id
        return Job(
            id=line.job_id(batch.id),
            kind=line.job["kind"],
            pipeline=line.pipeline,
            status=JobStatus.QUEUED,
            owner=batch.owner,
            priority="batch",
            input=line.job["input"],
            metadata=metadata,
            created_at=now,
            queued_at=now,
            deadline=batch.expires_at,
            cancel_at_deadline=True,
        )

    def _finish_if_done(self, batch: Batch, now: float) -> None:
        if self.batches.in_flight(batch.id):
            return
        if batch.status is BatchStatus.CANCELLING:
            end, code = BatchStatus.CANCELLED, "batch_cancelled"
        elif batch.status is BatchStatus.IN_PROGRESS and now >= batch.expires_at:
            end, code = BatchStatus.EXPIRED, "batch_expired"
        elif batch.status in {BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING}:
            if self.batches.waiting(batch.id):
                return
            end, code = BatchStatus.COMPLETED, ""
        else:
            return
        if code and not self._never_run(batch, code):
            return  # its waiting lines are not in the error file yet: the next step
        if end is BatchStatus.COMPLETED:
            self.batches.set_if(batch.id, [BatchStatus.IN_PROGRESS],
                                status=str(BatchStatus.FINALIZING),
                                finalizing_at=repr(time.time()))  # fmt: skip
        output_id = self._write(batch, "output")
        error_id = self._write(batch, "errors")
        stamp = {
            BatchStatus.COMPLETED: "completed_at",
            BatchStatus.CANCELLED: "cancelled_at",
            BatchStatus.EXPIRED: "expired_at",
        }[end]
        ended = self.batches.set_if(
            batch.id,
            [BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING],
            status=str(end),
            output_file_id=output_id,
            error_file_id=error_id,
            **{stamp: repr(time.time())},
        )
        self.batches.close(batch.id)
        if ended:
            log.info("batch %s: %s", batch.id, end)
            self._notify(batch.id)

    def _never_run(self, batch: Batch, code: str) -> bool:
        """Every line still waiting, to the error file; False when that could not be done
        this time."""

        def error(line: Line) -> str:
            message = f"line {line.line}: {WHY[code]}"
            return invalid_line(batch.id, line.line, line.custom_id, code, message)

        if self.batches.fail_waiting(batch.id, error):
            return True
        log.warning("batch %s: its waiting lines kept changing; next step", batch.id)
        return False

    def _write(self, batch: Batch, name: str) -> str:
        """The file's lines to storage, as an OpenAI file object; '' when it has none.
        Its id is the batch's own, so that writing it again replaces it."""
        lines = self.batches.gathered(batch.id, name)
        if not lines:
            return ""
        data = ("\n".join(lines) + "\n").encode()
        key = f"{batch.owner}/batches/{batch.id}/{name}.jsonl"
        stored = self.storage.put(key, data, "application/jsonl")
        digest = hashlib.sha256(f"{batch.id}:{name}".encode()).hexdigest()[:24]
        obj = FileObject(
            id=f"file-{digest}",
            owner=batch.owner,
            key=key,
            bytes=stored.size_bytes,
            filename=f"{batch.id}_{name}.jsonl",
            purpose="batch_output",
            created_at=time.time(),
        )
        # Kept as long as a job's record: the retention sweep deletes it after that.
        self.batches.save_file(obj, self.settings.job_ttl_s)
        return obj.id

    def _notify(self, batch_id: str) -> None:
        """Hand the batch's end to its webhook, if it has one that wants it."""
        batch = self.batches.get(batch_id)
        event = end_event(batch) if batch is not None else None
        if batch is not None and batch.webhook is not None and event is not None:
            enqueue_webhook(self.app, batch.id, batch.webhook.url, event)
