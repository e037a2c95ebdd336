"""Load under faults, and the accounting of what happened to every accepted job.

`Load` submits echo and sleep jobs back to back from client threads and keeps each 202's
job id and when it came; anything else (503s, connection errors) is counted by kind.
`settle` waits until every accepted job has ended (bounded) and tallies them: succeeded,
failed, lost (no record, or no end in time), run twice (more than one `running` event)
and ended twice (more than one end event). Used by tests/test_durability.py and
`bench/faults.py`, through `under_load` (a deployment, the load, a fault halfway).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
from pydantic import JsonValue

from common import redis_client
from jobs.states import TERMINAL_VALUES
from jobstore.api_keys import create_key
from jobstore.job_lookup import JobLookup
from tuning.deployment import Deployment, serving

BODIES: tuple[dict[str, JsonValue], ...] = (
    {"kind": "echo", "input": {"text": "fault"}},
    {"kind": "sleep", "input": {"steps": 1, "step_ms": 1}},
)


@dataclass
class Load:
    """Client threads submitting until `stop()`."""

    base_url: str
    key: str
    clients: int = 4
    accepted: list[tuple[float, float, str]] = field(default_factory=list)
    """(monotonic time the submit was sent, when its 202 came, job id)."""
    others: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        self._threads = [
            threading.Thread(target=self._run, name=f"load-{i}", daemon=True)
            for i in range(self.clients)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=10) as http:
            i = 0
            while not self._stop.is_set():
                i += 1
                sent = time.monotonic()
                try:
                    r = http.post("/v1/jobs", json=BODIES[i % len(BODIES)])
                except httpx.HTTPError as exc:
                    self.others[type(exc).__name__] += 1
                    self._stop.wait(0.05)
                    continue
                if r.status_code == 202:
                    self.accepted.append((sent, time.monotonic(), r.json()["id"]))
                else:
                    self.others[str(r.status_code)] += 1
                    self._stop.wait(0.05)

    def recovered_after(self, t: float) -> float | None:
        """Seconds from `t` to the first 202 of a submit sent after `t`."""
        later = [answered for sent, answered, _ in self.accepted if sent > t]
        return min(later) - t if later else None

    @property
    def ids(self) -> list[str]:
        return [job_id for _, _, job_id in self.accepted]


@dataclass
class Tally:
    accepted: int = 0
    succeeded: int = 0
    failed: int = 0
    lost: int = 0
    run_twice: int = 0
    ended_twice: int = 0
    lost_ids: list[str] = field(default_factory=list, repr=False)


def settle(r: redis.Redis, job_ids: list[str], timeout_s: float = 90.0) -> Tally:
    """Wait (up to `timeout_s`) until every job has ended, then count."""
    jobs = JobLookup(r)
    deadline = time.monotonic() + timeout_s
    pending = list(job_ids)
    while pending and time.monotonic() < deadline:
        statuses = jobs.statuses(pending)
        pending = [j for j, s in zip(pending, statuses, strict=True) if s not in TERMINAL_VALUES]
        if pending:
            time.sleep(0.25)
    tally = Tally(accepted=len(job_ids))
    for job_id in job_ids:
        (status,) = jobs.statuses([job_id])
        events = jobs.status_events(job_id)
        if status == "succeeded":
            tally.succeeded += 1
        elif status in TERMINAL_VALUES:
            tally.failed += 1
        else:
            tally.lost += 1
            tally.lost_ids.append(job_id)
        tally.run_twice += events.count("running") > 1
        tally.ended_twice += sum(events.count(s) for s in TERMINAL_VALUES) > 1
    return tally


@dataclass
class FaultRun:
    """One deployment under load with a fault halfway."""

    tally: Tally
    before: int
    """Jobs accepted before the fault."""
    recover_s: float | None
    """From the fault to the first 202 of a submit sent after it."""
    others: dict[str, int]
    base_url: str


def under_load(
    redis_url: str,
    tmp: Path,
    durability: str,
    fault: Callable[[str], None],
    duration_s: float,
    clients: int = 4,
) -> FaultRun:
    """API, reaper, an echo and a sleep worker on `redis_url` at `durability`, `clients`
    submitting for `duration_s`; `fault(base_url)` runs halfway. Waits for every accepted
    job to end, then counts them."""
    dep = Deployment(
        redis_url,
        tmp,
        env_overrides={"MMQ_REDIS__DURABILITY": durability, "MMQ_LEASE__TTL_S": "5"},
    )
    with serving(dep):
        dep.start_api()
        dep.start_reaper()
        dep.start_scheduler()
        dep.start_worker("echo")
        dep.start_worker("sleep")
        r = redis_client.connect(redis_url)
        key = create_key(r, "faults")
        with Load(dep.base_url, key, clients=clients) as load:
            time.sleep(duration_s / 2)
            before = len(load.accepted)
            fault_at = time.monotonic()
            fault(dep.base_url)
            time.sleep(duration_s / 2)
        tally = settle(r, load.ids)
        return FaultRun(
            tally, before, load.recovered_after(fault_at), dict(load.others), dep.base_url
        )
