"""The half of the job store that is not I/O (`StoreBase`): the arguments of each script
and what its reply means, which `JobStore` (sync) and `AsyncJobStore` (async) in
`jobstore.store` share, so that the two give the same answers and raise the same errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from redis.exceptions import NoScriptError

from broker.kombu_redis import TaskMessage
from jobs import keys
from jobs.errors import NotDurable
from jobs.models import Event, Job
from jobs.settings import Settings
from jobs.webhooks import wants
from jobs.wire import JobEvent
from jobstore import recent_counts as recent
from jobstore.changes import (
    ALL_FIELDS,
    SubmitResult,
    Transition,
    TransitionResult,
    decode_result,
    decode_submit,
    submit_args,
    webhook_events,
)
from jobstore.codec import (
    event_from_entry,
)
from jobstore.durability import Durability
from telemetry.metric_defs import (
    END_FIELDS,
    JOBS_REJECTED,
    JOBS_SUBMITTED,
    Sample,
    end_samples,
    field_of,
)

EventListener = Callable[[str, str, JobEvent], None]
"""(job_id, webhook url, event) -> None: hands an event to webhook delivery."""


def events_from(job_id: str, entries: Any) -> list[Event]:
    """Events from an XRANGE reply (of a decoding client)."""
    return [event_from_entry(job_id, entry_id, fields) for entry_id, fields in entries or []]


def after_bound(after: str | None) -> str:
    return f"({after}" if after else "-"


def settle(replies: list[Any], attempt: int) -> tuple[Any, Any] | None:
    """A script's reply and the durability wait's, run in one pipeline: (the script's
    reply, the wait's, judged later by `Durability.unconfirmed`); None on the first attempt
    when the server restarted between the pipeline's script check and its run (the script
    did not run): send it once more, loading it again. A script's error is raised."""
    raw, wait = replies
    if isinstance(raw, NoScriptError) and attempt == 0:
        return None
    if isinstance(raw, Exception):
        raise raw
    return raw, wait


def reading_end_fields(change: Transition) -> Transition:
    """`change`, returning the fields its end metrics need when it ends the job (all of
    them, where the caller asked for all)."""
    if not change.target.terminal or change.read_back == ALL_FIELDS:
        return change
    return replace(change, read_back=END_FIELDS)


def end_counts(
    change: Transition, result: TransitionResult
) -> tuple[list[Sample], list[recent.Cell]]:
    """The metric samples of a change that ended its job, and the overview's cells."""
    if not (result.ok and change.target.terminal):
        return [], []
    samples = end_samples({name: value or None for name, value in result.read_back.items()})
    return samples, recent.end_cells(result.read_back, samples) if samples else []


def end_wait_for_runs(settings: Settings) -> int:
    """How long a worker's (or the reaper's) end waits for its confirmation, in ms: as long
    as a lease would last (its job has ended and the end must not be lost; past that the
    reaper would act on the job anyway), and at least `redis.durability_timeout_ms`."""
    return max(settings.redis.durability_timeout_ms, int(settings.lease.ttl_s * 1000))


NOT_WAITED = None
"""The durability wait's reply where none was run (`memory`, or a change that does not
end its job): nothing to confirm."""

Answer = TypeVar("Answer", SubmitResult, TransitionResult)


@dataclass
class Done(Generic[Answer]):
    """What a script's reply means (`StoreBase._submitted`, `StoreBase._applied`): the answer,
    what its writes imply for the store to do (whether or not they were confirmed), and
    the error to raise after that where they were not."""

    answer: Answer
    held: list[tuple[str, str]] = field(default_factory=list)
    """Notices the script held back, to publish."""
    webhooks: list[tuple[str, JobEvent]] = field(default_factory=list)
    """(url, event) to hand to `on_event`."""
    samples: list[Sample] = field(default_factory=list)
    cells: list[recent.Cell] = field(default_factory=list)
    unconfirmed: NotDurable | None = None
    failed: Exception | None = None
    """The error of a change that raised in its script (`JobStore.apply_many`)."""

    def result(self) -> Answer:
        if self.failed is not None:
            raise self.failed
        if self.unconfirmed is not None:
            raise self.unconfirmed
        return self.answer


class StoreBase:
    """Everything of the two stores but their I/O: the arguments of each script and what
    its reply means. `JobStore` and `AsyncJobStore` run the same steps in the same order,
    one with `await`:

    - `submit`: `_submit_call`; `_run` (the script, and the durability wait that the call
      asks for, in one round trip); `_submitted`; `_follow_up`; `Done.result`;
    - `apply`: `_change_call`; `_run`; `_applied`; `_follow_up`; `Done.result`.
    """

    def __init__(
        self,
        settings: Settings,
        on_event: EventListener | None,
        metered: bool,
        end_wait_ms: int | None,
    ) -> None:
        self.settings = settings
        self.on_event = on_event
        self.metered = metered
        self.durability = Durability(settings.redis)
        self.end_wait_ms = self.durability.timeout_ms if end_wait_ms is None else end_wait_ms
        """How long a change that ends a job waits for its confirmation (ms)."""

    def _submit_call(
        self,
        job: Job,
        message: TaskMessage | None,
        max_queued: int,
        idempotency: tuple[str, str] | None,
        cost: int,
    ) -> tuple[list[str], list[str], int | None]:
        """The submit script's keys and argument, and how long it waits for its
        confirmation (ms; None: no wait, at `memory`)."""
        counter = (keys.metric(JOBS_SUBMITTED.name), field_of((job.kind,)))
        key_list, args = submit_args(
            job,
            self.settings,
            max_queued=max_queued,
            idempotency=idempotency,
            message=message,
            counter=counter if self.metered else None,
            cost=cost,
        )
        wait_ms = self.durability.timeout_ms if self.durability.waits else None
        return key_list, args, wait_ms

    def _submitted(self, job: Job, raw: list[Any], wait: Any) -> Done[SubmitResult]:
        result = decode_submit(job.id, raw)
        done = Done(result)
        if result.outcome == "ok":
            done.unconfirmed = self._unconfirmed(wait, f"job {job.id}")
            # raw[1]: the queued event's id ('' where a resent script found the job made).
            if raw[1] and job.webhook is not None and self.on_event is not None:
                queued = JobEvent(
                    id=raw[1],
                    job_id=job.id,
                    type="status",
                    data={"status": "queued"},
                    ts=job.created_at,
                )
                if wants(job.webhook.events, "status", queued["data"]):
                    done.webhooks.append((job.webhook.url, queued))
        elif result.outcome == "full" and self.metered:
            labels = (job.kind, job.pipeline)
            done.samples = [(JOBS_REJECTED, labels, 1)]
            done.cells = [recent.rejected_cell(*labels, now=job.created_at)]
        return done

    def _change_call(
        self, change: Transition, now: float
    ) -> tuple[Transition, list[str], list[str], int | None]:
        """The change as run (reading back what its metrics need), the transition script's
        keys and argument, and its wait: a change that ends its job is confirmed at
        `redis.durability`, waiting up to `end_wait_ms`; None: no wait."""
        if self.metered:
            change = reading_end_fields(change)
        key_list, args = change.script_args(self.settings, now)
        waits = change.target.terminal and self.durability.waits
        return change, key_list, args, self.end_wait_ms if waits else None

    def _applied(
        self, change: Transition, raw: list[Any], wait: Any, now: float
    ) -> Done[TransitionResult]:
        result = decode_result(change, raw)
        done = Done(result, held=result.held)
        if result.ok:  # a refused change wrote nothing: there is nothing to confirm
            if self.metered:
                done.samples, done.cells = end_counts(change, result)
            if self.on_event is not None:
                done.webhooks = webhook_events(change, result, now)
            done.unconfirmed = self._unconfirmed(wait, f"the end of job {change.job_id}")
        return done

    def _unconfirmed(self, wait: Any, what: str) -> NotDurable | None:
        return None if wait is NOT_WAITED else self.durability.unconfirmed(wait, what)
