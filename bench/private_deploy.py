"""A private deployment for a bench: its own Redis on a free port, a temporary directory,
the tests' config (echo and sleep pipelines) plus the bench's, the API, the reaper (whose
release stage the scheduling benches measure) and the workers asked for; everything is
stopped after."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from common.procs import free_port
from harness.deploy import Deployment, running
from host.redis_server import RedisServer


@contextlib.contextmanager
def private_deployment(
    config: str, env: dict[str, str], workers: Sequence[str], prefix: str = "mmq-bench-"
) -> Iterator[Deployment]:
    """The deployment, with the API up and each of `workers` (pipeline names) ready."""
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
        server = RedisServer(tmp / "redis", port=free_port(), persist=False)
        server.start()
        stack.callback(server.stop)
        (tmp / "deploy").mkdir()
        yield stack.enter_context(running(server.url, tmp / "deploy", env, workers, config))
