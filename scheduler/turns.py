"""On-demand turns: an on-demand pipeline in the way of a model that waits to load on its
device (`keys.device_waiting`), loaded for its `min_loaded_s`, is fed nothing new, so
that it finishes its queue, goes idle and makes room (`workers.residency`)."""

from __future__ import annotations

import time

from jobs.settings import Settings
from jobstore.scheduling import SchedulingStore


def draining(store: SchedulingStore, settings: Settings, live: set[str]) -> set[str]:
    """The pipelines to feed nothing new this step (and, on the way, the waits of killed
    workers and the model entries of forgotten ones are dropped)."""
    now = time.time()
    found: set[str] = set()
    for device in store.device_turns():
        gone = [w for w in device.waiting if w not in live]  # killed while it waited
        store.drop_waiting(device.host, device.device, gone)
        silent = [w for w in device.models if w not in live]
        store.forget_models(device.host, device.device, silent)
        waiters = {pipeline for w, pipeline in device.waiting.items() if w in live}
        if not waiters:
            continue
        for worker, entry in device.models.items():
            config = settings.pipelines.get(entry.pipeline)
            if (
                config is not None
                and worker in live
                and not entry.resident
                and entry.pipeline not in waiters
                and now - entry.loaded_at >= config.min_loaded_s
            ):
                found.add(entry.pipeline)
    return found
