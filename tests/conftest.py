"""Fixtures with real parts: a Redis-compatible server, the API under uvicorn, Celery workers."""

from __future__ import annotations

import base64
import compileall
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from _pytest.terminal import TerminalReporter

from harness.api_client import Api, new_owner
from harness.inprocess import InProcess, inprocess_settings, serve_in_process
from harness.pool import DeploymentPool, Spec
from host.redis_server import RedisServer
from tuning.deployment import Deployment, flush

WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"mmq-test-webhook-secret-32-bytes").decode()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--module-durations",
        type=int,
        default=0,
        metavar="N",
        help="show the N slowest test modules (setup, calls and teardown summed)",
    )


def pytest_terminal_summary(terminalreporter: TerminalReporter, config: pytest.Config) -> None:
    """The slowest modules (`--module-durations N`): where a run's time goes, module by
    module, with a module's own fixtures' setup and teardown in it."""
    shown = int(config.getoption("--module-durations"))
    if not shown:
        return
    by_module: dict[str, float] = defaultdict(float)
    tests: dict[str, set[str]] = defaultdict(set)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                module = report.nodeid.split("::", 1)[0]
                by_module[module] += report.duration
                tests[module].add(report.nodeid)
    slowest = sorted(by_module.items(), key=lambda item: -item[1])[:shown]
    terminalreporter.write_sep("=", f"slowest {len(slowest)} modules")
    for module, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}s  {module} ({len(tests[module])} tests)")


REPO = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session: pytest.Session) -> None:
    """The repository's packages compiled to bytecode (`__pycache__`, which git ignores)
    before a test starts a process of them. Where bytecode may not be written
    (PYTHONDONTWRITEBYTECODE, as on the machines the suite is measured on), every API,
    worker and CLI process compiled mmq's own modules from source at every start; files
    already compiled are skipped. The environments' own packages are compiled when they
    are installed (`scripts/install.sh`'s `bytecode` step)."""
    if hasattr(session.config, "workerinput"):
        return  # pytest-xdist's test processes: the controller has done it
    for package in sorted(init.parent for init in REPO.glob("*/__init__.py")):
        if package.name != "tests":  # pytest rewrites and caches the tests' own
            compileall.compile_dir(package, quiet=1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "engines(*names, why): the test applies to these values of its module's `engine` "
        "parameter only; with the others it is not collected (`why` says why)",
    )


KINDS = ("test_batches", "test_cli", "test_console", "test_deadlines", "test_quotas",
         "test_realtime", "test_responses", "test_worker_stop")  # fmt: skip
ENGINES = ("test_llm", "test_llm_features")
SHARED = dict.fromkeys(KINDS, "kinds") | dict.fromkeys(ENGINES, "llm-engines")
"""Modules that run in one test process under pytest-xdist (`make test`), by what they
share: `kinds` the session's deployment with a worker of every kind (`kinds_dep`), started
once and not twice at once; `llm-engines` the modules that start vLLM engines by threes,
never two such deployments at once on two cores. Every other module is a group of its
own, so that its module-scoped deployment starts once."""
DURATIONS = Path(__file__).parent / "durations.json"
"""Each module's seconds in a whole run (its tests' setup, call and teardown), measured;
the longest groups go first, so that no long one starts last (`make test` prints them:
copy a new run's into it when they move). Read only in xdist's test processes."""


def _group(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return SHARED.get(Path(module).stem, module)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a dev dependency
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Tests go to the test processes a group at a time (`_group`): a module, or modules
    that share a session's deployment. xdist's own `loadgroup` would do it from marks, but
    its hook that reads them is not called under pytest 9, so this is its `loadscope` with
    the group for the scope."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the runs of an `engines`-marked test with an engine it does not apply to, and in
    a test process of pytest-xdist put the longest groups first (`_group`; the order within
    one is kept). A run in one process keeps the files' order."""
    kept, dropped = [], []
    for item in items:
        mark = item.get_closest_marker("engines")
        callspec = getattr(item, "callspec", None)
        engine = callspec.params.get("engine") if callspec is not None else None
        (dropped if mark and engine is not None and engine not in mark.args else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    if hasattr(config, "workerinput"):
        durations = json.loads(DURATIONS.read_text())
        seconds: dict[str, float] = defaultdict(float)
        for module in {item.nodeid.split("::", 1)[0] for item in kept}:
            seconds[_group(module)] += durations.get(module, 0)
        kept.sort(key=lambda item: -seconds[_group(item.nodeid)])  # stable: a group's order
    items[:] = kept


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"), persist=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def rclient(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True)


@pytest.fixture(scope="session")
def kinds_dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A worker of every built-in kind on its tiny model, with echo and sleep, on a Redis
    of its own (no test's flush touches it): see harness/kinds.py."""
    from harness.kinds import kinds_deployment
    from harness.models.llm import cached_tiny_llm
    from harness.models.sd import cached_tiny_sd

    models = {"llm": cached_tiny_llm(tmp_path_factory), "sd": cached_tiny_sd(tmp_path_factory)}
    env = {
        "MMQ_API__KEEPALIVE_S": "1",
        "MMQ_WEBHOOKS__SECRET": WEBHOOK_SECRET,
        "MMQ_QUOTAS__WINDOW_S": "2",  # a key given a requests quota waits 2 s at most
    }
    with kinds_deployment(tmp_path_factory.mktemp("kinds"), models, env) as dep:
        yield dep


@pytest.fixture(scope="session")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeploymentPool]:
    """The session's shared deployments, by configuration and environment (harness/pool.py):
    each on a Redis of its own, started once, stopped together at the end."""
    shared = DeploymentPool(tmp_path_factory.mktemp("pool"))
    yield shared
    shared.close()


DEFAULT = Spec.of(
    ("echo", "sleep"), {"MMQ_API__KEEPALIVE_S": "1", "MMQ_WEBHOOKS__SECRET": WEBHOOK_SECRET}
)
"""The default deployment: API, reaper, scheduler, an echo and a sleep worker."""


@pytest.fixture(scope="module")
def deployment(pool: DeploymentPool) -> Deployment:
    """API + reaper + scheduler + echo worker + sleep worker on a Redis of their own, shared
    by the modules that use it (`pool`; started again if a test left a process of it dead).
    A module reads its Redis at `deployment.redis_url` (`rclient` is the session's)."""
    return pool.get(DEFAULT)


@pytest.fixture
def api(deployment: Deployment, request: pytest.FixtureRequest) -> Api:
    """A client with a fresh owner for this test."""
    name = "t" + str(abs(hash(request.node.nodeid)) % 10**10) + str(time.monotonic_ns() % 10**6)
    return new_owner(deployment.redis_url, deployment.base_url, name)


@pytest.fixture
def anyio_backend() -> str:
    """Tests marked `anyio` run on asyncio, as the API does under uvicorn."""
    return "asyncio"


@pytest.fixture
async def inprocess(redis_url: str, tmp_path: Path) -> AsyncIterator[InProcess]:
    """The API in this process on a flushed Redis, no worker (harness/inprocess.py).
    Async: a test that uses it is marked `anyio`."""
    flush(redis_url)
    settings = inprocess_settings(redis_url, tmp_path, webhook_secret=WEBHOOK_SECRET)
    async with serve_in_process(settings) as served:
        yield served
