"""The `mmq` command line: up, api, worker, reaper, keys."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from jobs.settings import Settings, load_settings

app = typer.Typer(help="mmq: multimodal inference jobs on Redis and Celery workers.")
keys_app = typer.Typer(help="API keys.")
app.add_typer(keys_app, name="keys")

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML config (default: $MMQ_CONFIG_FILE)")
]


def _settings(config: Path | None) -> Settings:
    settings = load_settings(config)
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )
    return settings


def _require_redis(settings: Settings) -> str:
    if not settings.redis_url:
        typer.echo("MMQ_REDIS_URL is not set (only `mmq up` starts a server of its own)", err=True)
        raise typer.Exit(2)
    return settings.redis_url


@app.command()
def api(config: ConfigOpt = None) -> None:
    """Run the HTTP API (uvicorn)."""
    import uvicorn

    from api.app import create_app

    settings = _settings(config)
    _require_redis(settings)
    uvicorn.run(
        create_app(settings),
        host=settings.api.host,
        port=settings.api.port,
        log_level=settings.log_level.lower(),
        access_log=False,
    )


@app.command()
def worker(
    pipeline: Annotated[str, typer.Option(help="Pipeline name from the config")],
    instance: Annotated[int, typer.Option(help="Instance number on this device")] = 0,
    config: ConfigOpt = None,
) -> None:
    """Run one worker process serving one pipeline."""
    from workers.process import run_worker

    settings = _settings(config)
    _require_redis(settings)
    if pipeline not in settings.enabled_pipelines:
        typer.echo(f"no enabled pipeline {pipeline!r} in the config", err=True)
        raise typer.Exit(2)
    run_worker(settings, pipeline, instance)


@app.command()
def reaper(config: ConfigOpt = None) -> None:
    """Run the reaper: requeue the jobs of dead workers."""
    from jobs.broker import make_celery
    from jobs.store import JobStore
    from workers.reaper import Reaper

    settings = _settings(config)
    _require_redis(settings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    Reaper(JobStore.connect(settings), settings, make_celery(settings)).run_forever(stop)


@app.command()
def up(config: ConfigOpt = None) -> None:
    """Start everything: Redis (if MMQ_REDIS_URL is unset), the API, the reaper, workers."""
    from workers.up import run_up

    run_up(_settings(config), config)


@keys_app.command("create")
def keys_create(name: str, config: ConfigOpt = None) -> None:
    """Create an API key for owner NAME and print it (it is stored only as a hash)."""
    import redis

    from jobs.apikeys import create_key

    settings = _settings(config)
    client = redis.Redis.from_url(_require_redis(settings), decode_responses=True)
    try:
        typer.echo(create_key(client, name))
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


@keys_app.command("revoke")
def keys_revoke(name: str, config: ConfigOpt = None) -> None:
    """Delete every API key of owner NAME."""
    import redis

    from jobs.apikeys import revoke_owner

    settings = _settings(config)
    client = redis.Redis.from_url(_require_redis(settings), decode_responses=True)
    typer.echo(f"revoked {revoke_owner(client, name)} key(s)")


if __name__ == "__main__":
    app()
