"""A worker's job changes, made in groups: the starts (or the ends) that its threads ask
for while one is in flight go together in the next script call (`JobStore.apply_many`,
through `common.combining.Combiner`).

A worker feeding an LLM engine takes up to `INTAKE_MAX` messages per read and starts their
jobs on as many threads at once; their ends come in bursts too, at the engine's steps. Made
one by one, each is a script call and a round trip; made in a group, the round trip is paid
once per group. Nothing else changes: each change is the same script step as alone (the
same checks of status and lease, in the same atomic call), each caller gets its own answer
or error, and a change that ends a job is confirmed at `redis.durability` before its
caller hears of it.
"""

from __future__ import annotations

from common.combining import Combiner
from jobstore.changes import Transition, TransitionResult
from jobstore.store import JobStore
from jobstore.store_base import Done


class GroupCommit:
    """`apply` as `JobStore.apply`, grouped with the changes other threads make meanwhile."""

    def __init__(self, store: JobStore) -> None:
        self._combiner: Combiner[Transition, Done[TransitionResult]] = Combiner(store.apply_many)

    def apply(self, change: Transition) -> TransitionResult:
        """As `JobStore.apply`: the answer, or `NotDurable` where the end was made but not
        confirmed in time, or the script's error for this change."""
        return self._combiner.call(change).result()

    @property
    def calls(self) -> int:
        """Script calls made so far."""
        return self._combiner.calls
