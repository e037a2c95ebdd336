"""Everything mmq knows of kombu's Redis layout, in one module (nothing else names a key
or a field of it).

Celery's Redis broker is kombu's Redis transport. mmq reads and writes its data directly
where going through Celery would cost atomicity or a round trip:

- the submit and requeue scripts push a job's task message themselves, in the script
  that stores or requeues the job, so a queued job never lacks its message
  (`task_message`, `PUSH_MESSAGE_LUA`);
- `/metrics` reads each queue's depth, and the reaper finds queued jobs whose message is
  missing (`priority_lists`, `queued_job_ids`);
- the reaper puts back messages left in `unacked` by a worker that died before starting
  their job (`Unacked`);
- workers and the API use `Transport` (or `SentinelTransport` on Redis Sentinel),
  kombu's transport with one Redis client per channel, whose consumer takes up to
  `INTAKE_MAX` waiting messages per read on Redis 7 or later (`sentinel_broker`: the
  broker settings for the latter).

The layout, as kombu 5.6 and 5.7 write it (`kombu/transport/redis.py`), pinned by
`KOMBU_VERSIONS` here and in pyproject.toml, and held to kombu's own by
`tests/test_kombu_redis.py`:

- a queue is one list per priority step: the bare queue name for step 0, then
  `queue:3`, `queue:6`, `queue:9` (`sep`); producers LPUSH, consumers BRPOP, so the
  right end is the oldest message;
- a message is a JSON envelope: the body (base64), its encoding and content type, the
  task's headers, and properties with a delivery tag, the routing and the priority;
- a delivered message that is not acknowledged yet is kept in the hash `unacked` (tag ->
  JSON `[envelope, exchange, routing key]`) and the sorted set `unacked_index` (tag ->
  time of delivery).
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import os
import socket
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, TypedDict
from urllib.parse import parse_qsl, quote, urlsplit

import redis
from celery import Celery
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

from broker.queues import TASK_NAME
from common import redis_client
from common.combining import Combiner
from common.redis_client import RedisOptions, SentinelUrl

log = logging.getLogger(__name__)

KOMBU_VERSIONS = (">=5.6", "<5.8")
"""The kombu releases whose Redis layout this module matches (pyproject pins the same)."""

TRANSPORT = "broker.kombu_redis:Transport"
"""`broker_transport` for redis:// and rediss:// brokers (see `Transport`)."""
SENTINEL_TRANSPORT = "broker.kombu_redis:SentinelTransport"
"""`broker_transport` for brokers found through Redis Sentinel."""

PRIORITY_VALUES: dict[str, int] = {"high": 0, "normal": 3, "low": 6, "batch": 9}
"""mmq's priorities as kombu priority steps: lower numbers are served first (`batch`, the
lines of a batch, after everything else)."""
PRIORITY_STEPS = [0, 3, 6, 9]
QUEUE_SEP = ":"
"""Between a queue's name and a priority step in the names of its lists."""
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
INTAKE_MAX = 32
"""Messages a consumer takes from a queue in one round trip at most (`Channel`)."""

PUSH_MESSAGE_LUA = """
local function push_message(list, envelope)
  redis.call('LPUSH', list, envelope)
end
"""
"""Lua: what kombu's producer does with a message (scripts that queue a job call it)."""


class TransportOptions(TypedDict):
    """kombu's Redis transport options for this layout."""

    visibility_timeout: float
    priority_steps: list[int]
    sep: str
    queue_order_strategy: str


def transport_options(visibility_timeout_s: float) -> TransportOptions:
    """Celery's `broker_transport_options` for this layout."""
    return {
        "visibility_timeout": visibility_timeout_s,
        "priority_steps": PRIORITY_STEPS,
        "sep": QUEUE_SEP,
        "queue_order_strategy": "priority",
    }


class SentinelOptions(TypedDict, total=False):
    """The transport options of a broker found through Redis Sentinel (kombu's
    `SentinelChannel`); none for any other broker."""

    master_name: str
    socket_connect_timeout: float
    socket_timeout: float
    sentinel_kwargs: RedisOptions
    """redis-py's `Sentinel` connection options (`SentinelUrl.sentinel_kwargs`), handed
    through kombu to redis-py as they are."""


class BrokerSettings(NamedTuple):
    """Celery's `broker_url`, `broker_transport`, the transport options beyond
    `transport_options` and `broker_failover_strategy` (None: kombu's)."""

    url: str
    transport: str
    options: SentinelOptions
    failover_strategy: Callable[[Sequence[str]], Iterator[str]] | None = None


def sentinel_broker(target: SentinelUrl) -> BrokerSettings:
    """Broker settings for a master found through sentinels. kombu takes the sentinels
    as alternate URLs (`sentinel://h1:p1/db;sentinel://h2:p2/db`), each with the
    master's credentials, and the rest as transport options."""
    username, password = target.username, target.password
    auth = ""
    if username or password:
        auth = f"{quote(username or '', safe='')}:{quote(password or '', safe='')}@"
    url = ";".join(
        f"sentinel://{auth}{_netloc_host(h)}:{port}/{target.db}" for h, port in target.sentinels
    )
    options: SentinelOptions = {
        "master_name": target.master_name,
        "socket_connect_timeout": target.socket_connect_timeout_s,
    }
    if target.socket_timeout_s is not None:
        options["socket_timeout"] = target.socket_timeout_s
    if sentinel_kwargs := target.sentinel_kwargs():
        options["sentinel_kwargs"] = sentinel_kwargs
    return BrokerSettings(url, SENTINEL_TRANSPORT, options, stay_on_first_url)


def socket_broker(url: str) -> BrokerSettings:
    """Broker settings for `unix://[[user]:password@]/path[?db=N]`. kombu reads a socket
    path only as `redis+socket://...?virtual_host=N`, and that prefix picks kombu's own
    transport over mmq's (`broker_transport`): this broker shares no client per channel."""
    parts = urlsplit(url)
    db = dict(parse_qsl(parts.query)).get("db", "0")
    auth = parts.netloc.rpartition("@")[0]
    return BrokerSettings(
        f"redis+socket://{auth + '@' if auth else ''}{parts.path}?virtual_host={db}", "redis", {}
    )


def _netloc_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def stay_on_first_url(alternates: Sequence[str]) -> Iterator[str]:
    """Celery's `broker_failover_strategy` on Sentinel: after a connection error, reconnect
    as before. The channel asks every sentinel itself (redis-py's `Sentinel` over all the
    alternates), so kombu's switch to the next URL gains nothing, and it would re-read
    the transport from that URL's scheme: kombu's `sentinel`, in place of mmq's. A bare
    host name keeps the transport and the rest of the first URL."""
    return itertools.repeat(urlsplit(alternates[0]).hostname or "") if alternates else iter(())


class TaskHeaders(TypedDict, total=False):
    """The headers of a Celery task message (protocol 2, `AMQP.as_task_v2`) that mmq reads
    or sets; the others go through as Celery made them."""

    task: str
    id: str
    root_id: str
    argsrepr: str


class DeliveryInfo(TypedDict):
    exchange: str
    routing_key: str


class TaskProperties(TypedDict, total=False):
    """A task message's properties: Celery's (`correlation_id`, `reply_to`), and those
    that kombu's producer adds."""

    correlation_id: str
    reply_to: str
    delivery_mode: int
    delivery_info: DeliveryInfo
    priority: int
    body_encoding: str
    delivery_tag: str


Envelope = TypedDict(
    "Envelope",
    {
        "body": str,
        "content-encoding": str,
        "content-type": str,
        "headers": TaskHeaders,
        "properties": TaskProperties,
    },
)
"""A message as kombu's Redis transport keeps it (JSON): in a queue's list, and first in
an `unacked` record."""

IntakeHook = Callable[[str, Sequence[Envelope]], None]
"""(queue, messages) -> None: what a worker does with an intake's messages together."""


def on_intake(hook: IntakeHook | None) -> None:
    """Have this process's consumers call `hook` with the messages of each intake (the
    messages one BLMPOP took, up to `INTAKE_MAX`) before they are delivered one by one: a
    worker starts their jobs in one script call (`workers.jobrunner.JobRunner.prestart`).
    Not called on Redis before 7 (one message per BRPOP)."""
    Channel.intake_hook = hook


class TaskTemplate(NamedTuple):
    """What Celery makes of a run-job task (`_task_template`), whatever its id and job."""

    headers: TaskHeaders
    properties: TaskProperties
    rest: list[object]
    """The body after the args: the kwargs and Celery's embedded options."""


class TaskMessage(NamedTuple):
    """A task message as kombu's Redis transport stores it: its list and its envelope."""

    list_key: str
    envelope: str


def priority_list(queue: str, step: int) -> str:
    """The list that holds a queue's messages of one priority step."""
    return f"{queue}{QUEUE_SEP}{step}" if step else queue


def priority_lists(queue: str) -> dict[str, str]:
    """mmq priority -> the list of `queue` that holds it."""
    return {name: priority_list(queue, step) for name, step in PRIORITY_VALUES.items()}


ORIGIN = f"gen{os.getpid()}@{socket.gethostname()}"

_TEMPLATES: weakref.WeakKeyDictionary[Celery, TaskTemplate] = weakref.WeakKeyDictionary()


def _task_template(app: Celery) -> TaskTemplate:
    """Headers, properties and the body after the args of a run-job task, built once per
    app by Celery (protocol 2); only the task id and the job id differ between tasks."""
    template = _TEMPLATES.get(app)
    if template is None:
        task = app.amqp.as_task_v2("", TASK_NAME, args=[""], origin=ORIGIN, ignore_result=None)
        template = _TEMPLATES[app] = TaskTemplate(
            task.headers, task.properties, list(task.body[1:])
        )
    return template


def task_message(app: Celery, job_id: str, queue: str, priority: str) -> TaskMessage:
    """The message that runs `job_id` from `queue` at mmq `priority`, as Celery's
    `send_task` would send it, built without I/O for a script to push with the job."""
    headers, properties, rest = _task_template(app)
    step = PRIORITY_VALUES[priority]
    task_id = str(uuid.uuid4())
    args = [job_id]
    body = json.dumps([args, *rest]).encode()
    envelope: Envelope = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {**headers, "id": task_id, "root_id": task_id, "argsrepr": repr(args)},
        "properties": {
            **properties,
            "correlation_id": task_id,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": step,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return TaskMessage(priority_list(queue, step), json.dumps(envelope))


def job_id_of(envelope: Envelope) -> str | None:
    """The job id argument of a run-job task message; None for any other message."""
    try:
        if envelope["headers"].get("task") != TASK_NAME:
            return None
        body: str | bytes = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]) if args else None
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        return None


def queued_job_ids(client: redis.Redis, queue: str) -> set[str]:
    """The job ids of every message waiting in `queue` (all priorities)."""
    pipe = client.pipeline(transaction=False)
    for key in priority_lists(queue).values():
        pipe.lrange(key, 0, -1)
    found: set[str] = set()
    for raws in pipe.execute():
        found.update(j for j in (job_id_of(json.loads(raw)) for raw in raws) if j)
    return found


class Unacked:
    """kombu's record of delivered, unacknowledged messages, through a channel of `app`."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    @contextmanager
    def _channel(self) -> Iterator[Any]:
        with self.app.pool.acquire(block=True) as conn:
            yield conn.default_channel

    def job_ids(self) -> set[str]:
        """The job ids of every unacknowledged message."""
        with self._channel() as channel:
            raws = channel.client.hvals(UNACKED)
        return {j for j in (job_id_of(json.loads(raw)[0]) for raw in raws) if j}

    def older_than(self, before: float, limit: int) -> list[tuple[str, str | None, float]]:
        """(delivery tag, job id, when delivered) of messages delivered before `before`,
        oldest first."""
        found: list[tuple[str, str | None, float]] = []
        with self._channel() as channel:
            client = channel.client
            index = client.zrangebyscore(UNACKED_INDEX, "-inf", before, 0, limit, withscores=True)
            for raw_tag, delivered in index:
                tag = _text(raw_tag)
                raw = client.hget(UNACKED, tag)
                if raw is not None:
                    found.append((tag, job_id_of(json.loads(raw)[0]), float(delivered)))
        return found

    def discard(self, tag: str) -> None:
        """Forget a message that nothing needs any more (as an ack would)."""
        with self._channel() as channel:
            channel.client.pipeline().hdel(UNACKED, tag).zrem(UNACKED_INDEX, tag).execute()

    def restore(self, tag: str) -> None:
        """Put the message back at the head of its queue (kombu's own restore)."""
        with self._channel() as channel:
            channel.qos.restore_by_tag(tag, channel.client)


class QoS(kombu_redis.QoS):
    """kombu's acknowledgement emulation, whose `unacked` records can be written for
    several messages in one round trip (`note`) before they are delivered, and removed
    for several in one round trip (`ack`).

    kombu's ack removes one message's record in a transaction of its own (MULTI, ZREM,
    HDEL, EXEC), on the task's thread after the task. The tasks of a worker that feeds an
    LLM engine end in bursts, at the engine's steps: here the acks that threads make while
    one is in flight go together in the next (`common.combining.Combiner`), two commands
    for the group. Each thread returns once its own record is gone, as with kombu's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._noted: set[str] = set()
        self._acks: Combiner[str, None] = Combiner(self._forget)

    def ack(self, delivery_tag: str) -> None:
        self._acks.call(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def _forget(self, tags: Sequence[str]) -> list[None]:
        """Remove these messages' `unacked` records, in one round trip."""
        with self.channel.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=False)
            pipe.zrem(self.unacked_index_key, *tags)
            pipe.hdel(self.unacked_key, *tags)
            pipe.execute()
        return [None] * len(tags)

    def note(self, payloads: Sequence[Envelope]) -> None:
        """Record these messages in `unacked` as kombu's `append` does, in one pipeline;
        their `append` then only does the in-memory bookkeeping."""
        now = time.time()
        tags = []
        with self.pipe_or_acquire() as pipe:
            for payload in payloads:
                properties = payload["properties"]
                tag, delivery = properties["delivery_tag"], properties["delivery_info"]
                fields = [payload, delivery["exchange"], delivery["routing_key"]]
                record = kombu_dumps(fields)  # type: ignore[no-untyped-call]
                pipe.zadd(self.unacked_index_key, {tag: now})
                pipe.hset(self.unacked_key, tag, record)
                tags.append(tag)
            pipe.execute()
        self._noted.update(tags)

    def append(self, message: Any, delivery_tag: str) -> None:
        if delivery_tag in self._noted:
            self._noted.discard(delivery_tag)
            # Its record is written: the in-memory bookkeeping alone.
            virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]
            return
        super().append(message, delivery_tag)  # type: ignore[no-untyped-call]


class Channel(kombu_redis.Channel):
    """kombu's channel, sharing one Redis client instead of building one per command, and
    taking up to `INTAKE_MAX` messages per round trip.

    kombu's `Channel.conn_or_acquire` builds a new `redis.Redis` for each synchronous use,
    and the acks-late path uses it twice per task: to note the delivered message in
    `unacked` (before the task runs) and to remove it (the ack). Building a client fills
    its table of ~170 response callbacks, ~90 us here: over a quarter of a worker's CPU
    per no-op job, on the consumer thread that every task passes through. A client is
    safe to share between threads (each command takes a connection from the pool).

    After the broker connection is lost, Celery closes it twice: the first close (in
    `collect`) fails on the dead socket and detaches the transport from the connection;
    the second drops the channel's pool, then puts its unacknowledged messages back,
    which needs a pool, rebuilt from the detached (None) connection: kombu 5.7 raises
    AttributeError there, which Celery does not expect (the worker stops: "Unrecoverable
    error"). A closed channel here uses the client it had (its pool reconnects, on
    Sentinel to the new master), so the ack of a task that was running then still
    lands; without one it raises a connection error, which the close ignores (the
    messages stay in `unacked`, where the reaper finds them).

    kombu's consumer takes one message per BRPOP, then writes its `unacked` record in a
    second round trip, both on the consumer thread, before it asks for the next: about
    1,300 no-op tasks a second here with 512 threads (`bench.celery_floor`), so the last
    of a burst of 256 requests waits about 190 ms in the queue for that alone. On Redis
    7 or later this channel asks with BLMPOP for up to `INTAKE_MAX` messages of the first
    non-empty list (the same priority order; never more than the prefetch limit leaves
    room for), writes their records in one pipeline, then delivers them in order. Older
    servers get kombu's BRPOP."""

    QoS = QoS
    intake_hook: IntakeHook | None = None
    """Called on the consumer thread with each intake's queue and messages, after their
    `unacked` records are written and before they are delivered (`on_intake`)."""
    _shared_client: Any = None
    _multi_pop: bool | None = None
    """Whether reads are BLMPOPs (Redis 7, no key prefix): decided on the first read."""

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        if self.connection is None or self.connection.client is None:  # closed (see above)
            if shared is None:
                raise redis.ConnectionError("the broker connection is closed")
            yield shared
            return
        if shared is None or shared.connection_pool is not self.pool:
            shared = self._shared_client = self._create_client()  # type: ignore[no-untyped-call]
        yield shared

    def _brpop_start(self, timeout: float | None = None) -> None:
        if not self._pops_many():
            super()._brpop_start(timeout)  # type: ignore[no-untyped-call]
            return
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        lists = [
            self._q_for_pri(q, pri)  # type: ignore[no-untyped-call]
            for pri in self.priority_steps
            for q in queues
        ]
        wait = self.brpop_timeout if timeout is None else timeout
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]
        room = self.qos.can_consume_max_estimate()  # None: no prefetch limit
        count = INTAKE_MAX if room is None else max(1, min(INTAKE_MAX, room))
        self.client.connection.send_command(
            "BLMPOP", wait or 0, len(lists), *lists, "RIGHT", "COUNT", count
        )

    def _brpop_read(self, **options: Any) -> bool:
        if not self._pops_many():
            return bool(super()._brpop_read(**options))  # type: ignore[no-untyped-call]
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "BLMPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # the next poll reconnects
                raise
            if not reply:
                raise virtual.Empty()
            source, items = reply
            dest = _text(source).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            payloads = [kombu_loads(_text(item)) for item in items]  # type: ignore[no-untyped-call]
            self.qos.note(payloads)
            self._intake(dest, payloads)
            for payload in payloads:
                self.connection._deliver(payload, dest)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # as kombu's own read
            # kombu 5.7 flushes a pending re-auth here; a release without it has none.
            flush_reauth = getattr(self, "_flush_brpop_reauth", None)
            if flush_reauth is not None:
                flush_reauth()

    def _intake(self, queue: str, payloads: list[Envelope]) -> None:
        """Hand an intake's messages to the process's hook (`on_intake`) before delivery;
        its failure is logged and delivery goes on (each task then does alone what the
        hook would have done for all)."""
        hook = Channel.intake_hook
        if hook is None:
            return
        try:
            hook(queue, payloads)
        except Exception:
            log.exception("the intake hook failed for %d messages of %s", len(payloads), queue)

    def _pops_many(self) -> bool:
        """Whether reads are BLMPOPs: the server has it (Redis 7) and kombu adds no key
        prefix (BLMPOP's keys would miss it); else kombu's BRPOP. Asked once."""
        if self._multi_pop is None:
            try:
                major = int(str(self.client.info("server")["redis_version"]).split(".")[0])
            except (redis.RedisError, KeyError, ValueError):
                major = 0
            self._multi_pop = major >= 7 and not self.global_keyprefix
        return self._multi_pop


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (its pool asks the sentinels for the master), sharing one
    Redis client as `Channel` does."""


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def broker_for(url: str) -> BrokerSettings:
    """Celery's broker settings for the Redis `url` (any form `common.redis_client` reads)."""
    scheme = redis_client.scheme_of(url)
    if scheme == "sentinel":
        target = redis_client.parse_sentinel_url(url)
        return sentinel_broker(target)
    redis_client.check_url(url)
    if scheme == "unix":
        return socket_broker(url)
    return BrokerSettings(url, TRANSPORT, {})
