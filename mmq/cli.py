"""The `mmq` command line: up, workers, devices, api, worker, reaper, scheduler, keys, tune,
record."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from jobs.settings import Settings, config_file_path, load_settings
from mmq.keys_cli import keys_app
from mmq.settings import (
    ConfigOpt,
    check_redis,
    check_redis_url,
    command_settings,
    with_redis,
)
from mmq.tune import record, tune

if TYPE_CHECKING:
    from pydantic import JsonValue
    from rich.console import Console

    from host.placement import Plan
    from jobs.wire import Job
    from mmq.client import Client

app = typer.Typer(help="mmq: multimodal inference jobs on Redis and Celery workers.")


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import version

        typer.echo(f"mmq {version('mmq')}")
        raise typer.Exit


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version"),
    ] = False,
) -> None:
    """mmq: multimodal inference jobs on Redis and Celery workers."""


app.add_typer(keys_app, name="keys")

RedisOpt = Annotated[
    str | None,
    typer.Option(
        "--redis",
        help="Redis URL (sets MMQ_REDIS_URL for this command and what it starts)",
        show_default=False,
    ),
]
HostOpt = Annotated[
    str | None,
    typer.Option(
        "--host-name",
        help="This host's name in worker ids and metrics (sets MMQ_HOST_NAME; default: "
        "the system's host name)",
        show_default=False,
    ),
]


@app.command()
def api(config: ConfigOpt = None, redis: RedisOpt = None) -> None:
    """Run the HTTP API (uvicorn)."""
    settings = with_redis(command_settings(config, redis))
    host, port, level = settings.api.host, settings.api.port, settings.log_level.lower()
    grace = max(1, round(settings.api.shutdown_grace_s))  # uvicorn takes whole seconds
    if settings.api.workers == 1:
        import uvicorn

        from api.app import create_app

        uvicorn.run(
            create_app(settings), host=host, port=port, log_level=level, access_log=False,
            timeout_graceful_shutdown=grace,
        )  # fmt: skip
        return
    # uvicorn's worker processes take nothing but the environment: this process becomes
    # uvicorn's supervisor with an environment that gives each of them what this one
    # resolved (the Redis URL, the host name, the config file).
    env = os.environ | settings.child_env()
    if (path := config_file_path(config)) is not None:
        env["MMQ_CONFIG_FILE"] = str(Path(path).resolve())
    argv = [
        sys.executable, "-m", "uvicorn", "api.app:app_from_environment", "--factory",
        "--workers", str(settings.api.workers), "--host", host, "--port", str(port),
        "--log-level", level, "--no-access-log", "--timeout-graceful-shutdown", str(grace),
    ]  # fmt: skip
    os.execve(sys.executable, argv, env)


WORKER_PIPELINE_HELP = (
    "Pipeline name from the config; repeated: on-demand pipelines of one device that share "
    "the process"
)


@app.command()
def worker(
    pipeline: Annotated[list[str], typer.Option(help=WORKER_PIPELINE_HELP)],
    instance: Annotated[int, typer.Option(help="Instance number on this device")] = 0,
    device: Annotated[
        str | None, typer.Option(help="cpu, gpu:N, mig:UUID (default: the pipeline's)")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(min=1)] = None,
    max_batch: Annotated[int | None, typer.Option(min=1)] = None,
    max_wait_ms: Annotated[float | None, typer.Option(min=0)] = None,
    runners: Annotated[int | None, typer.Option(min=1)] = None,
    config: ConfigOpt = None,
    redis: RedisOpt = None,
    host_name: HostOpt = None,
) -> None:
    """Run one worker process serving one pipeline (knob options override the config's),
    or several pipelines loaded on demand on one device (`--pipeline A --pipeline B`)."""
    from host.devices import discover
    from host.placement import PlacementError, apply_overrides, concrete_device
    from workers.process import check_shared, run_worker

    settings = with_redis(command_settings(config, redis, host_name))
    for name in pipeline:
        if name not in settings.enabled_pipelines:
            typer.echo(f"no enabled pipeline {name!r} in the config", err=True)
            raise typer.Exit(2)
    knobs = {"concurrency": concurrency, "max_batch": max_batch, "max_wait_ms": max_wait_ms,
             "runners": runners}  # fmt: skip
    if len(pipeline) > 1 and any(v is not None for v in knobs.values()):
        typer.echo("knob options apply to a worker of one pipeline", err=True)
        raise typer.Exit(2)
    for name in pipeline:
        base = settings.pipelines[name]
        spec = device or base.device
        try:
            if spec in ("auto", "gpu:*", "mig:*"):
                spec = concrete_device(spec, base, discover(), name)
        except PlacementError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
        settings.pipelines[name] = apply_overrides(base, spec, **knobs)
    if (why := check_shared(settings, pipeline)) is not None:
        typer.echo(why, err=True)
        raise typer.Exit(2)
    run_worker(settings, pipeline, instance)


@app.command()
def reaper(config: ConfigOpt = None) -> None:
    """Run the reaper: requeue the jobs of dead workers, expire jobs past their deadline.

    A second thread runs the retention sweep every `storage.sweep_interval_s`: it deletes
    uploads that no live job used once past `storage.upload_ttl_s`, and the stored outputs
    of jobs whose records have expired. Several reapers may run at once.
    """
    from broker.celery_app import make_celery, webhook_sender
    from cluster.reaper import Reaper
    from cluster.retention import start_sweeper
    from jobstore.store import JobStore
    from telemetry import tracing

    settings = with_redis(command_settings(config))
    tracing.setup(settings.tracing, "reaper")
    stop = _stop_on_signals()
    celery = make_celery(settings)
    store = JobStore.connect(settings, on_event=webhook_sender(celery), metered=True)
    store.tally.start()
    sweeper = start_sweeper(settings, stop)
    try:
        Reaper(store, settings, celery).run_forever(stop)
        sweeper.join(timeout=10)
    finally:
        store.tally.stop()


@app.command()
def scheduler(config: ConfigOpt = None) -> None:
    """Run the scheduler: every `batches.release_interval_s`, held jobs enter their queues
    by fair share, batch lines are fed while their pipelines have room (and stopped for
    waiting interactive work with `batches.preempt`), on-demand models take turns on their
    device, and each pipeline's room for submits is written. Several may run at once."""
    from api.batch_answers import RouteAnswers
    from broker.celery_app import make_celery, webhook_sender
    from jobstore.store import JobStore
    from scheduler.loop import Scheduler
    from storage.factory import make_storage

    settings = with_redis(command_settings(config))
    stop = _stop_on_signals()
    celery = make_celery(settings)
    # Not metered: the batch lines it submits are not 202s (`mmq_jobs_submitted`); its
    # tally counts the lines it stops for interactive work.
    store = JobStore.connect(settings, on_event=webhook_sender(celery))
    store.tally.start()
    answers = RouteAnswers(settings.public_url)
    try:
        Scheduler(store, settings, celery, make_storage(settings), answers).run_forever(stop)
    finally:
        store.tally.stop()


def _stop_on_signals() -> threading.Event:
    """Set on SIGINT or SIGTERM: a daemon's loop ends at its next wait."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


@app.command()
def webhooks(config: ConfigOpt = None) -> None:
    """Run a webhook delivery worker (needs MMQ_WEBHOOKS__SECRET)."""
    from cluster.webhooks import run_webhook_worker

    settings = with_redis(command_settings(config))
    if not settings.webhooks.secret:
        typer.echo("MMQ_WEBHOOKS__SECRET is not set (whsec_ + base64)", err=True)
        raise typer.Exit(2)
    run_webhook_worker(settings)


PlacementOpt = Annotated[
    Path | None,
    typer.Option("--placement", "-p", help="Placement TOML: which pipelines run on which device"),
]


def _plan(settings: Settings, placement: Path | None) -> Plan:
    from host.placement import PlacementError
    from host.up import host_plan

    try:
        return host_plan(settings, placement)
    except PlacementError as exc:
        typer.echo(f"placement refused: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def up(
    config: ConfigOpt = None,
    placement: PlacementOpt = None,
    redis: RedisOpt = None,
    host_name: HostOpt = None,
) -> None:
    """Start everything: Redis (if MMQ_REDIS_URL is unset), the API, the reaper, the
    scheduler, workers."""
    from host.up import run_up

    settings = command_settings(config, redis, host_name)
    check_redis_url(settings)
    if settings.redis_url:
        check_redis(settings)
    run_up(settings, config, _plan(settings, placement))


@app.command()
def workers(
    config: ConfigOpt = None,
    placement: PlacementOpt = None,
    redis: RedisOpt = None,
    host_name: HostOpt = None,
) -> None:
    """Start this host's workers only (one per device, pipeline and instance), supervised:
    a host joining a deployment (`--redis` or MMQ_REDIS_URL); no API, no reaper."""
    from host.up import run_up

    settings = with_redis(command_settings(config, redis, host_name))
    if settings.storage.backend == "local" and not settings.storage.local_shared:
        typer.echo(
            "storage.backend is local but this host joins a deployment whose API may run "
            "elsewhere: outputs written here must be readable there. Use storage.backend = "
            '"s3", or set storage.local_shared = true (MMQ_STORAGE__LOCAL_SHARED) if '
            f"{settings.data_dir / 'storage'} is a mount every host shares.",
            err=True,
        )
        raise typer.Exit(2)
    run_up(settings, config, _plan(settings, placement), services=False)


@app.command()
def devices(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    plan: Annotated[bool, typer.Option("--plan", help="Also show the worker plan")] = False,
    placement: PlacementOpt = None,
    topology: Annotated[
        Path | None, typer.Option(help="Plan for a host recorded with `mmq devices --json`")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """List the GPUs, MIG slices and CPU found here (NVML), and with --plan the workers
    that `mmq up` would start on them."""
    from rich.console import Console

    from host.devices import Topology, discover
    from host.placement import PlacementError
    from host.up import host_plan
    from mmq.devices import print_plan, print_topology

    found = Topology.from_json(topology.read_text()) if topology else discover()
    console = Console()
    if as_json and not plan:
        typer.echo(found.to_json())
        return
    print_topology(console, found)
    if plan or placement:
        try:
            print_plan(console, host_plan(load_settings(config), placement, found))
        except PlacementError as exc:
            console.print(f"[red]placement refused[/]: {exc}")
            raise typer.Exit(2) from None


@app.command()
def submit(
    kind: str,
    input: Annotated[
        str, typer.Option("--input", "-i", help="Input as JSON, or @file.json")
    ] = "{}",
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="One input field: name=value")
    ] = None,
    priority: Annotated[str, typer.Option(help="high, normal or low")] = "normal",
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Print its events, readably, until it ends")
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Wait for the job and write its result (audio, image, "
            "text; the output as JSON if FILE ends in .json) to FILE",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print JSON only: the job, or with --follow each raw event, one object a line",
        ),
    ] = False,
    url: Annotated[str | None, typer.Option(help="API base URL (default: from settings)")] = None,
    key: Annotated[str | None, typer.Option(envvar="MMQ_API_KEY", help="API key")] = None,
    config: ConfigOpt = None,
) -> None:
    """Submit a job; with --follow or --output, wait for it and exit non-zero unless it
    succeeds (1: failed or canceled; 2: the API refused a request)."""
    import httpx
    from rich.console import Console

    from mmq.client import Client, MmqAPIError

    console = Console(stderr=as_json)  # with --json, stdout carries JSON alone
    payload = _parse_input(input, set_ or [])
    base_url = url or load_settings(config).public_url
    with Client(base_url, key) as client:
        try:
            for name, path in _local_files(payload).items():  # `--set audio=./a.wav`
                payload[name] = client.upload(path)["key"]
            job = client.submit(kind, payload, priority=priority)
            waits = follow or output is not None
            _show_submitted(job, console, as_json, waits)
            if not waits:
                return
            job = _wait_for(client, job, console, follow, as_json)
            if output is not None and job["status"] == "succeeded":
                _write_output(client, job, output, console)
        except MmqAPIError as exc:
            console.print(f"[red]{exc}[/]")
            if exc.status == 401:
                console.print(UNAUTHORIZED_HINT)
            raise typer.Exit(2) from None
        except httpx.TransportError as exc:
            console.print(f"[red]cannot reach the API at {base_url}: {exc}[/]")
            console.print("is `mmq up` running there? (--url, or api.public_url, names it)")
            raise typer.Exit(2) from None
    _exit_for(job, console, shown=follow and not as_json)


UNAUTHORIZED_HINT = (
    "the API wants a key: pass --key mmq_..., or set MMQ_API_KEY (`mmq keys create NAME` makes one)"
)


def _local_files(payload: dict[str, JsonValue]) -> dict[str, Path]:
    """The input fields whose value is a file on this machine (uploaded, then named by
    their stored key): a path that starts with `./`, `../` or `~`, or an absolute path
    without spaces. Such a path that names no file here is a usage error that says so (the
    API would only see an odd key)."""
    found = {}
    for name, value in payload.items():
        if not isinstance(value, str):
            continue
        if value.startswith(("./", "../", "~")) or (value.startswith("/") and " " not in value):
            path = Path(value).expanduser()
            if not path.is_file():
                why = "is a directory" if path.is_dir() else "does not exist"
                raise typer.BadParameter(f"--set {name}={value}: the file {why}")
            found[name] = path
    return found


def _show_submitted(job: Job, console: Console, as_json: bool, waits: bool) -> None:
    import json

    if as_json:
        if not waits:
            typer.echo(json.dumps(job))
        return
    console.print(f"[bold]job[/] {job['id']}")
    if not waits:
        console.print_json(data=job)


def _wait_for(client: Client, job: Job, console: Console, follow: bool, as_json: bool) -> Job:
    from mmq.follow import follow_job, follow_json

    if not follow:
        return client.wait(job["id"])
    if as_json:
        return follow_json(client, job, typer.echo)
    return follow_job(client, job, console)


def _write_output(client: Client, job: Job, path: Path, console: Console) -> None:
    from rich.markup import escape

    from mmq.output_file import write_result

    try:
        written = write_result(client, job, path)
    except OSError as exc:
        console.print(f"[red]cannot write {escape(str(path))}: {escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    console.print(f"[bold]wrote[/] {escape(str(path))} ({written} bytes)", soft_wrap=True)


def _exit_for(job: Job, console: Console, shown: bool) -> None:
    """Exit 1 unless the job succeeded, saying why unless its events said so already."""
    if job["status"] == "succeeded":
        return
    from rich.markup import escape

    error = job.get("error")
    if not shown:
        why = f"{error.get('type')}: {error.get('message')}" if error else "no error given"
        console.print(f"[bold red]job {job['status']}[/]: {escape(why)}", soft_wrap=True)
    raise typer.Exit(1)


def _parse_input(raw: str, fields: list[str]) -> dict[str, JsonValue]:
    import json

    text = Path(raw[1:]).read_text() if raw.startswith("@") else raw
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"--input is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise typer.BadParameter("--input must be a JSON object")
    for field in fields:
        name, sep, value = field.partition("=")
        if not sep:
            raise typer.BadParameter(f"--set {field!r} is not name=value")
        try:
            payload[name] = json.loads(value)
        except json.JSONDecodeError:
            payload[name] = value
    return payload


app.command()(tune)
app.command()(record)

if __name__ == "__main__":
    app()
