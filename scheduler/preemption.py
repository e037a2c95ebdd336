"""Preemption (`batches.preempt`): interactive work that waits for a slot held by a batch
line stops the line that started last, at its next step (`Slots.to_preempt`); its worker
queues it again (the run is not counted as an attempt), and the freed slot takes the
interactive job first."""

from __future__ import annotations

import logging

from jobstore.store import JobStore
from scheduler.slots import Slots
from telemetry.metric_defs import BATCH_LINES_PREEMPTED

log = logging.getLogger(__name__)


def preempt_lines(store: JobStore, slots: dict[str, Slots]) -> None:
    for pipeline, slot in slots.items():
        stopped = sum(map(store.request_preempt, slot.to_preempt()))
        if stopped:
            log.info("%s: %d batch lines stopped for interactive work", pipeline, stopped)
            store.tally.add([(BATCH_LINES_PREEMPTED, (pipeline,), stopped)])
