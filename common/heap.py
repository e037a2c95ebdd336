"""The collector's view of a long-running server's heap.

A server process builds most of its objects once, at startup: imported frameworks,
settings, routes, a loaded model's Python side. They are never garbage, yet each full
collection walks every one of them again, and a process that streams tokens allocates
enough to start collections often. `freeze_startup_heap` moves what is alive once the
process is ready out of the collector's generations (`gc.freeze`), so a collection walks
only what requests made since. vLLM's API server does the same after its startup.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect once, then leave every object alive now out of later collections."""
    gc.collect()
    gc.freeze()
