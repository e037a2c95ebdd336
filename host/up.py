"""`mmq up` (a whole deployment on this machine) and `mmq workers` (this host's workers
only, joining a deployment whose Redis runs elsewhere), in the foreground.

Workers follow the placement plan (`host.placement`): one process per (device,
pipeline, instance), each with `CUDA_VISIBLE_DEVICES` set to its one device (a GPU's or
MIG slice's UUID; empty for the CPU) and `--device` telling the pipeline where it is.
The supervisor restarts a dead one with backoff, first printing why a worker that died
during its start failed (what it recorded in Redis); Ctrl-C stops them all.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import typer
from redis.exceptions import RedisError

from common import redis_client
from common.procs import port_in_use
from host.datadir import DataDirInUse, DataDirLock
from host.devices import Device, Topology, discover
from host.launcher import ProcSpec, Supervisor, mmq_command
from host.placement import Assignment, PlacementError, Plan, load_placement, plan_placement
from host.redis_server import RedisServer
from jobs.settings import Settings
from jobstore.liveness import LivenessStore

WHY_MAX_CHARS = 400


def host_plan(settings: Settings, placement: Path | None, topology: Topology | None = None) -> Plan:
    """The workers for this host (raises PlacementError when they cannot run here)."""
    found = topology if topology is not None else discover()
    plan = plan_placement(settings, found, load_placement(placement) if placement else None)
    worker_groups(settings, plan)  # refuses what cannot share a process
    return plan


class StartReasons:
    """Why a worker exited during its start, from what it recorded in Redis
    (`LivenessStore.record_start`), for the console."""

    def __init__(self, redis_url: str | None) -> None:
        client = redis_client.connect(redis_url, socket_timeout=2) if redis_url else None
        self.store = LivenessStore(client) if client is not None else None

    def for_pipeline(self, pipeline: str) -> Callable[[int], str | None]:
        return lambda pid: self.why(pipeline, pid)

    def why(self, pipeline: str, pid: int) -> str | None:
        """One line when the worker `pid` of `pipeline` failed or died while loading."""
        if self.store is None:
            return None
        try:
            state = self.store.start_of(pipeline)
        except (RedisError, OSError):
            return None
        if state.get("pid") != str(pid):
            return None  # another worker's start, or none recorded
        if state.get("state") == "failed":
            reason = " | ".join(state.get("reason", "").splitlines()[:2])
            return f"pipeline {pipeline} failed to start: {reason}"[:WHY_MAX_CHARS]
        if state.get("state") == "loading":
            return f"pipeline {pipeline}: the worker died while loading (no reason recorded)"
        return None


def pinned_env(device: Device) -> dict[str, str]:
    """The environment that pins a worker to `device` alone (no GPU for the CPU). With
    Celery's `NOSETPS`: where setproctitle is installed (the dev lock has it, for
    vllm-router), Celery would rename the process over its command line and environment
    (`/proc/PID/cmdline`, `/proc/PID/environ`); they stay as launched, so the worker's
    pipeline, device and pinning can be read there."""
    env = {"CUDA_VISIBLE_DEVICES": device.visible_devices, "NOSETPS": "1"}
    if device.kind != "cpu":
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def worker_spec(
    group: list[Assignment], extra: list[str], reasons: StartReasons | None = None
) -> ProcSpec:
    """One worker process: a pipeline's instance on a device, or several on-demand
    pipelines of a device that share it (all `share_process`)."""
    a = group[0]
    knobs = [f"--{k.replace('_', '-')}={v}" for k, v in a.overrides.items()]
    pipelines = [arg for g in group for arg in ("--pipeline", g.pipeline)]
    argv = mmq_command(
        "worker", *pipelines, "--instance", str(a.instance), "--device", a.device.id,
        *knobs, *extra,
    )  # fmt: skip
    env = pinned_env(a.device)
    why = _first_reason([g.pipeline for g in group], reasons) if reasons is not None else None
    label = "+".join(g.pipeline for g in group)
    return ProcSpec(f"worker {label}#{a.instance} on {a.device.id}", argv, env, why)


def _first_reason(pipelines: list[str], reasons: StartReasons) -> Callable[[int], str | None]:
    """Why the worker `pid` of any of `pipelines` failed or died while loading."""
    return lambda pid: next(filter(None, (reasons.why(p, pid) for p in pipelines)), None)


def worker_groups(settings: Settings, plan: Plan) -> list[list[Assignment]]:
    """The plan's worker processes: one per assignment, except that the on-demand
    pipelines of a device that set `share_process` share one per instance (raises
    PlacementError for knobs placed on those: the process takes them from the config)."""
    groups: list[list[Assignment]] = []
    shared: dict[tuple[str, int], list[Assignment]] = {}
    for a in plan.assignments:
        if a.on_demand and settings.pipelines[a.pipeline].share_process:
            key = (a.device.id, a.instance)
            if key not in shared:
                shared[key] = []
                groups.append(shared[key])
            shared[key].append(a)
        else:
            groups.append([a])
    for group in groups:
        if len(group) > 1 and any(g.overrides for g in group):
            names = ", ".join(g.pipeline for g in group)
            raise PlacementError(f"{names} share a process: set their knobs in their config")
    return groups


def deployment_specs(
    settings: Settings,
    config: Path | None,
    plan: Plan,
    services: bool = True,
    reasons: StartReasons | None = None,
) -> list[ProcSpec]:
    """The API, the reaper, the scheduler and the webhook worker (with `services`), and the
    plan's workers."""
    extra = ["--config", str(config)] if config else []
    specs = []
    if services:
        specs += [
            ProcSpec("api", mmq_command("api", *extra)),
            ProcSpec("reaper", mmq_command("reaper", *extra)),
            ProcSpec("scheduler", mmq_command("scheduler", *extra)),
        ]
        if settings.webhooks.secret:
            specs.append(ProcSpec("webhooks", mmq_command("webhooks", *extra)))
    return specs + [worker_spec(g, extra, reasons) for g in worker_groups(settings, plan)]


def _describe(plan: Plan) -> str:
    if not plan.assignments:
        return "none"
    return ", ".join(
        f"{device}: " + " ".join(sorted({a.pipeline for a in group}))
        for device, group in plan.by_device().items()
    )


READY_POLL_S = 0.5
READY_WAIT_S = 3600.0
WORKER_STOP_SLACK_S = 10.0
"""Beyond `worker.shutdown_grace_s`: the hand-back of what did not stop, and the exit."""


def announce_ready(base_url: str, stopping: threading.Event) -> None:
    """Print one `ready` line when the API's `/readyz` first answers 200 (Redis up, a
    live worker for every enabled kind), from a thread of its own."""

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no env proxies

    def watch() -> None:
        started = time.monotonic()
        while not stopping.wait(READY_POLL_S) and time.monotonic() - started < READY_WAIT_S:
            try:  # urllib: httpx would log each poll at INFO
                with direct.open(f"{base_url}/readyz", timeout=2):
                    pass
            except OSError:  # 503 (an HTTPError) until ready, or no answer yet
                continue
            took = time.monotonic() - started
            typer.echo(f"ready  {base_url}  (a worker for every enabled kind; {took:.0f} s)")
            return

    threading.Thread(target=watch, name="announce-ready", daemon=True).start()


def _mmq() -> str:
    """How to call this installation's `mmq` from a shell: `mmq` when that is it on the
    PATH, else its path (`make run` does not put `.venv/bin` on the PATH)."""
    here = Path(sys.executable).parent / "mmq"
    found = shutil.which("mmq")
    return "mmq" if found and Path(found).resolve() == here.resolve() else str(here)


def _keys_line(settings: Settings) -> str:
    make = f"`{_mmq()} keys create NAME` (same config and data dir; stored hashed in Redis)"
    if settings.auth.required:
        return f"required: make one with {make}"
    return f"not required on loopback; owners of their own jobs get one with {make}"


def _where_lines(settings: Settings) -> list[str]:
    data = settings.data_dir.resolve()
    if settings.storage.backend == "s3":
        files = f"s3://{settings.storage.s3.bucket}"
    else:
        files = str(data / "storage")
    logs = f"logs   here (every process); LLM engines in {data / 'engine-logs'}"
    if not settings.redis_url:
        logs += f"; Redis in {settings.embedded_redis_dir.resolve() / 'server.log'}"
    return [f"data   {data}   files {files}", logs]


def embedded_durability(settings: Settings) -> str:
    """`redis.durability` for `mmq up`'s embedded server: as set, else `fsync` (which
    runs the server with `appendfsync always`)."""
    if "durability" in settings.redis.model_fields_set:
        return settings.redis.durability
    return "fsync"


def run_up(settings: Settings, config: Path | None, plan: Plan, services: bool = True) -> None:
    """Run the plan's workers (and, with `services`, Redis unless one is named, the API
    and the reaper) until Ctrl-C; one `mmq up` per data dir (`host.datadir`)."""
    if not services:
        _run(settings, config, plan, services, None)
        return
    lock = DataDirLock(settings.data_dir)
    try:
        lock.acquire(api=settings.public_url, redis=settings.redis_url)
    except DataDirInUse as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    with lock:
        if taken := ports_taken(settings):
            typer.echo(taken, err=True)
            raise typer.Exit(2)
        _run(settings, config, plan, services, lock)


def ports_taken(settings: Settings) -> str | None:
    """What `mmq up` would listen on that another server holds, said in two lines with the
    setting that moves it (the API's port; the embedded Redis's where it starts one), or
    None. Checked before anything starts, instead of a server's traceback later."""
    wanted = [(settings.api.host, settings.api.port, "the API's", "MMQ_API__PORT (api.port)")]
    if not settings.redis_url:
        moved = "MMQ_EMBEDDED_REDIS_PORT (embedded_redis_port)"
        wanted.append(("127.0.0.1", settings.embedded_redis_port, "the embedded Redis's", moved))
    for host, port, whose, setting in wanted:
        if port_in_use(host, port):
            return (
                f"port {port} ({whose}) is in use by another server: mmq up starts nothing\n"
                f"stop that server, or set {setting}"
            )
    return None


def _run(
    settings: Settings, config: Path | None, plan: Plan, services: bool, lock: DataDirLock | None
) -> None:
    server: RedisServer | None = None
    env: dict[str, str] = {}
    if services and not settings.redis_url:
        durability = embedded_durability(settings)
        server = RedisServer(
            settings.embedded_redis_dir,
            port=settings.embedded_redis_port,
            fsync_always=durability == "fsync",
        )
        server.start()
        if lock is not None:
            lock.note(redis=server.url)
        env["MMQ_REDIS_URL"] = server.url
        env["MMQ_REDIS__DURABILITY"] = durability
        typer.echo(
            f"redis  {server.url}  (embedded; data in {server.data_dir}; "
            f"durability {durability}; restarted if it dies)"
        )
    reasons = StartReasons(env.get("MMQ_REDIS_URL") or settings.redis_url)
    # A worker finishes or hands back its jobs within its grace (workers.shutdown), then
    # needs a few seconds more for the jobs that ignore their cancel.
    stop_timeout_s = settings.worker.shutdown_grace_s + WORKER_STOP_SLACK_S
    supervisor = Supervisor(
        deployment_specs(settings, config, plan, services, reasons), stop_timeout_s=stop_timeout_s
    )
    supervisor.base_env.update({**settings.child_env(), **env})
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: supervisor.stop())
    if services:
        base = settings.public_url
        typer.echo(f"api    {base}   docs {base}/docs")
        typer.echo(f"keys   {_keys_line(settings)}")
    for line in _where_lines(settings):
        typer.echo(line)
    typer.echo(f"workers {_describe(plan)}   (Ctrl-C stops all)")
    for warning in plan.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if services:
        announce_ready(settings.public_url, supervisor.stopping)
    try:
        supervisor.run(on_pass=server.revive if server is not None else None)
    finally:
        supervisor.terminate()
        if server is not None:
            server.stop()
        typer.echo("stopped")
