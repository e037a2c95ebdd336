"""Every mmq process's way to Redis: one URL (`MMQ_REDIS_URL`) in, the clients out.

The URL is one of:

- `redis://[[user]:password@]host[:port][/db][?option=value&...]`, `rediss://...` (TLS) or
  `unix://[[user]:password@]/path/to/redis.sock[?db=N&...]`: redis-py's own URLs, with
  its options;
- `sentinel://[[user]:password@]host[:port][,host[:port]...]/master[/db][?option=value&...]`:
  Redis Sentinel. The sentinels (port 26379 unless given) name the current master of
  the group `master`; the user and password are the master's (and its replicas').
  Options: `sentinel_username` and `sentinel_password` (for sentinels that ask for their
  own), `socket_timeout` and `socket_connect_timeout` (seconds).

What a process takes: `connect` (a sync client: workers, the reaper, the CLI, `mmq up`),
`connect_async` (the API's client over a blocking pool, closed with `close_async`), and
`broker` (Celery's broker URL, transport and transport options, for `broker.celery_app`).

On Sentinel, a client asks the sentinels for the master each time it opens a connection
(redis-py's `SentinelConnectionPool`). When the master dies or is demoted, a command on
an open connection fails once with one of `FAILOVER_ERRORS` (a replica answers writes
with READONLY, which redis-py turns into a connection error and a disconnect); the next
connection goes to whichever server the sentinels name then. No process restarts, and
no command is retried behind its caller's back: a script that may have run is never run
twice by the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.asyncio as aredis
from redis.asyncio import sentinel as asentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MasterDownError, ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel

SCHEMES = ("redis", "rediss", "unix", "sentinel")
SENTINEL_PORT = 26379
SENTINEL_TIMEOUT_S = 2.0
"""Connect and read timeout on the sentinels (they answer at once or are down), and
the connect timeout on the master unless the URL says otherwise: a master's address
that no longer answers must fail fast, not after the system's TCP timeout."""
NO_RETRY = Retry(NoBackoff(), 0)
"""redis-py's plain `Redis(...)` retries a failed connect three times with backoff of
up to seconds (a refused password too): on each of several sentinels that are down,
that adds up. One try each; the caller's own loop is the retry. Said for the master's
connections too, where it is redis-py's default today: a command is never sent twice."""
NO_ASYNC_RETRY = AsyncRetry(NoBackoff(), 0)

RedisOptions = dict[str, str | int | float | Retry | AsyncRetry | None]
"""redis-py connection options by their names: the db, credentials, seconds, a retry."""

FAILOVER_ERRORS: tuple[type[Exception], ...] = (
    RedisConnectionError,  # also MasterNotFoundError, BusyLoadingError ("LOADING")
    RedisTimeoutError,
    ReadOnlyError,  # a demoted master, where redis-py has not turned it into the above
    MasterDownError,  # a replica that lost its master
)
"""What a command raises while Redis is down or failing over: a retry later may work."""

_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password", "socket_timeout",
                     "socket_connect_timeout")  # fmt: skip


class RedisUrlError(ValueError):
    """A Redis URL that mmq cannot use; the message says why (never the password)."""


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed `sentinel://` URL."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    socket_timeout_s: float | None = None
    socket_connect_timeout_s: float = SENTINEL_TIMEOUT_S

    def master_kwargs(self, asynchronous: bool = False) -> RedisOptions:
        """Connection options for the master (redis-py's names)."""
        return {
            "db": self.db,
            "username": self.username,
            "password": self.password,
            "socket_timeout": self.socket_timeout_s,
            "socket_connect_timeout": self.socket_connect_timeout_s,
            "retry": NO_ASYNC_RETRY if asynchronous else NO_RETRY,
        }

    def sentinel_kwargs(self, asynchronous: bool = False) -> RedisOptions:
        """Connection options for the sentinels (redis-py's names)."""
        timeout_s = self.socket_timeout_s or SENTINEL_TIMEOUT_S
        return {
            "username": self.sentinel_username,
            "password": self.sentinel_password,
            "socket_timeout": timeout_s,
            "socket_connect_timeout": self.socket_connect_timeout_s,
            "retry": NO_ASYNC_RETRY if asynchronous else NO_RETRY,
        }


def scheme_of(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def check_url(url: str) -> None:
    """Raise `RedisUrlError` unless `url` is a Redis URL that mmq can use."""
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        raise RedisUrlError(
            f"Redis URL must start with {', '.join(s + '://' for s in SCHEMES)}; "
            f"got {scheme + '://' if scheme else 'no scheme'}"
        )
    if scheme == "sentinel":
        parse_sentinel_url(url)
        return
    try:
        parse_url(url)  # type: ignore[no-untyped-call]  # redis-py: unannotated
    except ValueError as exc:
        raise RedisUrlError(f"bad Redis URL: {exc}") from None


def parse_sentinel_url(url: str) -> SentinelUrl:
    """`sentinel://[[user]:password@]host[:port][,...]/master[/db][?options]`, parsed."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() != "sentinel":
        raise RedisUrlError("a Sentinel URL starts with sentinel://")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if at else ("", "", "")
    names = [unquote(part) for part in path.split("/")] if path else []
    if names and names[-1] == "":
        names.pop()  # a trailing slash
    if not names or not names[0]:
        raise RedisUrlError("a Sentinel URL names the master group: sentinel://HOST:PORT/MASTER")
    if len(names) > 2:
        raise RedisUrlError("a Sentinel URL's path is /MASTER or /MASTER/DB")
    options = _sentinel_options(query)
    return SentinelUrl(
        sentinels=tuple(_host_port(h) for h in hosts.split(",")),
        master_name=names[0],
        db=_db(names[1]) if len(names) > 1 else 0,
        username=unquote(username) or None,
        password=unquote(password) or None,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
        socket_timeout_s=_seconds(options, "socket_timeout"),
        socket_connect_timeout_s=_seconds(options, "socket_connect_timeout") or SENTINEL_TIMEOUT_S,
    )


def _host_port(text: str) -> tuple[str, int]:
    if not text.strip():
        raise RedisUrlError("a Sentinel URL lists sentinels as HOST[:PORT],HOST[:PORT]...")
    try:
        parts = urlsplit(f"//{text}")
        host, port = parts.hostname, parts.port
    except ValueError:
        raise RedisUrlError(f"bad sentinel address {text!r}: HOST[:PORT]") from None
    if not host or parts.path or parts.username is not None:
        raise RedisUrlError(f"bad sentinel address {text!r}: HOST[:PORT]")
    return host, port or SENTINEL_PORT


def _db(text: str) -> int:
    if not text.isdigit():
        raise RedisUrlError(f"the database in a Sentinel URL is a number, not {text!r}")
    return int(text)


def _sentinel_options(query: str) -> dict[str, str]:
    pairs = parse_qsl(query, keep_blank_values=True)
    unknown = sorted({name for name, _ in pairs} - set(_SENTINEL_OPTIONS))
    if unknown:
        raise RedisUrlError(
            f"unknown Sentinel URL option(s) {', '.join(unknown)}; "
            f"known: {', '.join(_SENTINEL_OPTIONS)}"
        )
    return dict(pairs)


def _seconds(options: dict[str, str], name: str) -> float | None:
    raw = options.get(name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise RedisUrlError(f"Sentinel URL option {name} is a number of seconds > 0, not {raw!r}")
    return value


def connect(url: str, *, decode_responses: bool = True, **options: Any) -> redis.Redis:
    """A sync client for `url`; `options` are redis-py connection options
    (`socket_timeout=2`...), over what the URL says."""
    if scheme_of(url) == "sentinel":
        target = parse_sentinel_url(url)
        sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs())  # type: ignore[no-untyped-call]  # redis-py: unannotated
        kwargs = {**target.master_kwargs(), "decode_responses": decode_responses, **options}
        client = sentinel.master_for(target.master_name, **kwargs)  # type: ignore[no-untyped-call]  # redis-py: unannotated
        return cast(redis.Redis, client)
    check_url(url)
    options.setdefault("retry", NO_RETRY)
    return redis.Redis.from_url(url, decode_responses=decode_responses, **options)


class BlockingSentinelConnectionPool(
    asentinel.SentinelConnectionPool,
    aredis.BlockingConnectionPool,
):
    """redis-py's Sentinel pool that, like its `BlockingConnectionPool`, makes a request
    wait (up to `timeout`) for a free connection instead of failing at once."""


RESEND_ON_BROKEN: dict[str, AsyncRetry | list[type[Exception]]] = {
    "retry": AsyncRetry(ExponentialBackoff(cap=1.0, base=0.05), 3),
    "retry_on_error": [RedisConnectionError],
}
"""For `connect_async(resend_on_broken=True)`: a command whose connection broke (the
server restarted or failed over: a pooled connection is stale) is sent again on a new
connection, after 0.05, 0.1, 0.2 s. Only for callers whose commands are safe to run
twice: mmq's scripts are (a submit does nothing for a job that exists; a transition
checks the state it starts from)."""


def connect_async(
    url: str,
    *,
    max_connections: int,
    timeout_s: float,
    decode_responses: bool = True,
    resend_on_broken: bool = False,
) -> aredis.Redis:
    """An asyncio client over a pool of at most `max_connections`, where a command waits
    up to `timeout_s` for a free one; close it with `close_async`. Commands are sent
    once unless `resend_on_broken` (`RESEND_ON_BROKEN`)."""
    resend = RESEND_ON_BROKEN if resend_on_broken else {}
    if scheme_of(url) == "sentinel":
        target = parse_sentinel_url(url)
        sentinel = asentinel.Sentinel(  # type: ignore[no-untyped-call]  # redis-py: unannotated
            list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs(asynchronous=True)
        )
        client = sentinel.master_for(
            target.master_name,
            redis_class=aredis.Redis,
            connection_pool_class=BlockingSentinelConnectionPool,
            max_connections=max_connections,
            timeout=timeout_s,
            decode_responses=decode_responses,
            **(target.master_kwargs(asynchronous=True) | resend),
        )
        return cast(aredis.Redis, client)
    check_url(url)
    pool = aredis.BlockingConnectionPool.from_url(
        url, decode_responses=decode_responses, max_connections=max_connections,
        timeout=timeout_s, **({"retry": NO_ASYNC_RETRY} | resend),
    )  # fmt: skip
    return aredis.Redis.from_pool(pool)


async def close_async(client: aredis.Redis) -> None:
    """Close a client from `connect_async`: its pool, and its connections to the
    sentinels if it has them."""
    await client.aclose()
    pool = client.connection_pool
    if isinstance(pool, asentinel.SentinelConnectionPool):
        await pool.sentinel_manager.aclose()
