"""A command's settings: loaded from the config file and the environment, logging set
up, and a Redis that answers (the one `MMQ_REDIS_URL` names, else the embedded server of
an `mmq up` with the same data dir). Every `mmq` command that needs them starts here;
each one that cannot go on exits with the reason and status 2."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from jobs.settings import Settings, load_settings
from security import redact

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML config (default: $MMQ_CONFIG_FILE)")
]
"""The `--config` option every command takes."""


def command_settings(
    config: Path | None, redis: str | None = None, host_name: str | None = None
) -> Settings:
    """The settings, with the command's `--redis` and `--host-name` over the rest; the
    processes it starts get them through `Settings.child_env`."""
    overrides = {name: value for name, value in (("redis_url", redis), ("host_name", host_name))}
    settings = load_settings(config, **{k: v for k, v in overrides.items() if v})
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )
    redact.install(redact.known_secrets(settings))  # before any line that could hold one
    return settings


def check_redis_url(settings: Settings) -> None:
    """Exit with the reason when `MMQ_REDIS_URL` is set to a URL mmq cannot use."""
    from common.redis_client import RedisUrlError, check_url

    if not settings.redis_url:
        return
    try:
        check_url(settings.redis_url)
    except RedisUrlError as exc:
        typer.echo(f"MMQ_REDIS_URL: {exc}", err=True)
        raise typer.Exit(2) from None


def with_redis(settings: Settings) -> Settings:
    """`settings` with a Redis to use: `MMQ_REDIS_URL`, else the embedded server of an
    `mmq up` that runs with the same data dir; exits with the reason when there is none,
    when it does not answer, or when it cannot keep jobs (`jobstore.durability.server_problem`)."""
    check_redis_url(settings)
    if settings.redis_url:
        check_redis(settings)
        return settings
    from host.redis_server import running_url

    url = running_url(settings.embedded_redis_dir)
    if url is None and "data_dir" not in settings.model_fields_set:
        url = _the_one_running_up(settings)
    if url is None:
        typer.echo(
            f"MMQ_REDIS_URL is not set and no `mmq up` runs with data dir {settings.data_dir} "
            "(its embedded server would be found there)",
            err=True,
        )
        raise typer.Exit(2)
    found = settings.model_copy(update={"redis_url": url})
    check_redis(found)
    return found


def _the_one_running_up(settings: Settings) -> str | None:
    """The embedded server's URL of this user's one running `mmq up`, wherever its data
    dir is (`host.datadir.running_data_dirs`), said on stderr; exits naming them where
    several run (the data dir then says which); None where none runs."""
    from host.datadir import running_data_dirs
    from host.redis_server import running_url

    answering = {}
    for data_dir in running_data_dirs():
        redis_dir = settings.model_copy(update={"data_dir": data_dir}).embedded_redis_dir
        if (url := running_url(redis_dir)) is not None:
            answering[data_dir] = url
    if len(answering) > 1:
        dirs = ", ".join(str(d) for d in answering)
        typer.echo(
            f"MMQ_REDIS_URL is not set, no `mmq up` runs with data dir {settings.data_dir}, "
            f"and several run elsewhere (data dirs {dirs}): set MMQ_DATA_DIR to one of them",
            err=True,
        )
        raise typer.Exit(2)
    for data_dir, url in answering.items():
        typer.echo(f"using the `mmq up` with data dir {data_dir}", err=True)
        return url
    return None


def check_redis(settings: Settings) -> None:
    import redis

    from common.redis_client import connect
    from jobstore.durability import server_problem

    url = str(settings.redis_url)
    client = connect(url, decode_responses=False, socket_connect_timeout=5, socket_timeout=10)
    try:
        info = {**client.info("persistence"), **client.info("memory")}
    except (redis.RedisError, OSError) as exc:
        typer.echo(f"Redis at {safe_url(url)} does not answer: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        client.close()
    if problem := server_problem(settings.redis.durability, info):
        typer.echo(f"Redis at {safe_url(url)}: {problem}", err=True)
        raise typer.Exit(2)


def safe_url(url: str) -> str:
    """`url` without its password."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{creds.partition(':')[0]}:***@{host}" if at else url
