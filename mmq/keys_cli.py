"""`mmq keys`: create, list, revoke API keys and set an owner's limits (stored in Redis,
hashes only: `jobstore.api_keys`, `jobstore.quotas`)."""

from __future__ import annotations

from typing import Annotated

import typer

from mmq.settings import ConfigOpt, command_settings, with_redis

keys_app = typer.Typer(help="API keys.")


@keys_app.command("create")
def keys_create(
    name: str,
    config: ConfigOpt = None,
    admin: Annotated[
        bool,
        typer.Option(
            "--admin",
            help="May also use /v1/admin (the overview, every owner's jobs) and act on any "
            "owner's job, as the web console's admin view does",
        ),
    ] = False,
) -> None:
    """Create an API key for owner NAME and print it (it is stored only as a hash)."""
    from common import redis_client
    from jobstore.api_keys import create_key

    settings = command_settings(config)
    client = redis_client.connect(str(with_redis(settings).redis_url))
    try:
        typer.echo(create_key(client, name, admin=admin))
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


@keys_app.command("revoke")
def keys_revoke(
    name: Annotated[str | None, typer.Argument(help="Revoke every key of this owner")] = None,
    key_id: Annotated[
        str | None,
        typer.Option("--id", help="Revoke this one key (its id from `mmq keys list`)"),
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Delete every API key of owner NAME, or the one key `--id ID`."""
    from common import redis_client
    from jobstore.api_keys import revoke_key, revoke_owner

    if (name is None) == (key_id is None):
        raise typer.BadParameter("give an owner NAME or --id ID (one of them)")
    settings = command_settings(config)
    client = redis_client.connect(str(with_redis(settings).redis_url))
    if name is not None:
        typer.echo(f"revoked {revoke_owner(client, name)} key(s)")
        return
    gone = revoke_key(client, str(key_id))
    if gone is None:
        typer.echo(f"no one key has the id {key_id!r} (see `mmq keys list`)", err=True)
        raise typer.Exit(2)
    typer.echo(f"revoked key {gone.id} of {gone.owner}")


@keys_app.command("list")
def keys_list(config: ConfigOpt = None) -> None:
    """Every API key: its id (never the key), owner, whether it is an admin's, when made."""
    import datetime

    from common import redis_client
    from jobstore.api_keys import list_keys

    settings = command_settings(config)
    client = redis_client.connect(str(with_redis(settings).redis_url))
    for key in list_keys(client):
        made = datetime.datetime.fromtimestamp(key.created_at, datetime.UTC)
        role = "admin" if key.admin else "-"
        typer.echo(f"{key.id}  {key.owner:<24} {role:<5}  {made:%Y-%m-%d %H:%M} UTC")


@keys_app.command("limits")
def keys_limits(
    name: str,
    max_queued: Annotated[
        int | None, typer.Option(min=0, help="Jobs queued at once (0: no limit)")
    ] = None,
    requests: Annotated[
        int | None, typer.Option(min=0, help="Jobs per quotas.window_s (0: no limit)")
    ] = None,
    max_running: Annotated[
        int | None,
        typer.Option(min=0, help="Jobs released to the workers at once (0: no limit)"),
    ] = None,
    cost: Annotated[
        list[str] | None,
        typer.Option(
            help="KIND=N: cost per quotas.window_s of a kind's jobs (llm/embed/rerank tokens, asr "
            "audio seconds, tts characters, image megapixel-steps; 0: no limit); repeat it"
        ),
    ] = None,
    weight: Annotated[
        float | None, typer.Option(min=0.001, help="Its share under fair share (default 1)")
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="Back to the deployment's defaults (quotas.*)")
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Set the limits of owner NAME's keys (the options not given are left as they are),
    and print them with what it uses now."""
    import json
    import time

    from common import redis_client
    from jobstore import quotas
    from jobstore.quotas import KeyLimits, get_limits, set_limits

    settings = command_settings(config)
    client = redis_client.connect(str(with_redis(settings).redis_url))
    own = None if clear else get_limits(client, name)
    own = own or KeyLimits()
    costs = dict(own.costs or {})
    for item in cost or []:
        kind, _, value = item.partition("=")
        if not value.isdigit():
            raise typer.BadParameter(f"{item!r}: give KIND=N, e.g. llm=100000", param_hint="--cost")
        costs[kind] = int(value)
    try:
        own = KeyLimits.model_validate(
            own.model_dump()
            | {"costs": costs or None}
            | {
                k: v
                for k, v in {
                    "max_queued": max_queued,
                    "requests": requests,
                    "max_running": max_running,
                    "weight": weight,
                }.items()
                if v is not None
            }
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cost") from None
    set_limits(client, name, own)
    pipe = client.pipeline(transaction=False)
    quotas.reads(pipe, name, int(time.time() // settings.quotas.window_s))
    quota = quotas.from_reads(settings.quotas, pipe.execute(), name)
    shown = quota.model_dump(exclude={"owner"}) | {"weight": own.weight or 1}
    typer.echo(json.dumps(shown))
