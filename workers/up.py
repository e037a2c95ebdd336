"""`mmq up`: a whole deployment on this machine, in the foreground."""

from __future__ import annotations

import signal
from pathlib import Path

import typer

from jobs.settings import Settings
from workers.launcher import ProcSpec, Supervisor, mmq_command
from workers.redis_server import RedisServer


def deployment_specs(settings: Settings, config: Path | None) -> list[ProcSpec]:
    """The API, the reaper, and `instances` CPU workers for every enabled pipeline."""
    extra = ["--config", str(config)] if config else []
    specs = [
        ProcSpec("api", mmq_command("api", *extra)),
        ProcSpec("reaper", mmq_command("reaper", *extra)),
    ]
    if settings.webhooks.secret:
        specs.append(ProcSpec("webhooks", mmq_command("webhooks", *extra)))
    for name, pipeline in settings.enabled_pipelines.items():
        for instance in range(pipeline.instances):
            argv = mmq_command("worker", "--pipeline", name, "--instance", str(instance), *extra)
            specs.append(ProcSpec(f"worker {name}#{instance}", argv))
    return specs


def run_up(settings: Settings, config: Path | None) -> None:
    server: RedisServer | None = None
    env: dict[str, str] = {}
    if not settings.redis_url:
        server = RedisServer(settings.data_dir / "redis", port=settings.embedded_redis_port)
        server.start()
        env["MMQ_REDIS_URL"] = server.url
        typer.echo(f"redis  {server.url}  (embedded; data in {server.data_dir})")
    supervisor = Supervisor(deployment_specs(settings, config))
    supervisor.base_env.update(env)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: supervisor.stop())
    base = settings.public_url
    typer.echo(f"api    {base}   docs {base}/docs")
    typer.echo(f"workers {', '.join(settings.enabled_pipelines) or 'none'}   (Ctrl-C stops all)")
    try:
        supervisor.run()
    finally:
        supervisor.terminate()
        if server is not None:
            server.stop()
        typer.echo("stopped")
