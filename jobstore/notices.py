"""The pub/sub notices that the store's scripts publish (`jobstore/lua.py`), and the
channels they go on: on the events channel, the events of any job, one line per event
(one message holds the lines of the events written together); on the ends channel, each
job's terminal status notice again, as JSON, with the job's fields unless they are large
(`lua.NOTICE_JOB_MAX_BYTES`). A subscriber names a channel by what it carries
(`Channel`); its Redis name stays here (`keys.EVENTS_CHANNEL`, `keys.ENDS_CHANNEL`).

An event's line is its fields, separated by single spaces, and its data last, as the JSON
text it was written as: `ID JOB_ID TYPE TS TEXT_AT DATA`. No field but the data holds a
space, and no data a newline (compact JSON escapes it in strings). `TEXT_AT` is where, in
the data, an LLM token's text starts (`jobs.models.Event.text_at`; 0 for any other
event): a reader splits a message at its newlines and each line at its first five
spaces, and relays the data (or the text in it) without decoding its JSON.

Pub/sub is the one thing above the store that holds its own Redis connection (the API's
event hub, `mmq record`): a subscription is a connection, which a store cannot share.
"""

from __future__ import annotations

from typing import Literal, TypedDict

import redis
from pydantic import JsonValue
from redis.asyncio.client import PubSub as AsyncPubSub
from redis.client import PubSub

from jobs import keys
from jobs.models import Event

Channel = Literal["events", "ends"]
_CHANNELS: dict[Channel, str] = {"events": keys.EVENTS_CHANNEL, "ends": keys.ENDS_CHANNEL}


class Notice(TypedDict, total=False):
    """One notice of the ends channel: its event's fields (`jobs.models.Event`), and the
    job's fields as its hash holds them (`job`, absent when large)."""

    id: str
    job_id: str
    type: str
    data: dict[str, JsonValue]
    ts: float
    job: dict[str, str]


def event_lines(message: str | bytes) -> list[list[bytes]]:
    """The lines of one message of the events channel, one per event, in the order
    written, each split into its fields (`job_of` and `event_of` read them)."""
    text = message.encode() if isinstance(message, str) else message
    return [line.split(b" ", 5) for line in text.split(b"\n")]


def job_of(line: list[bytes]) -> str:
    """The job an event's line belongs to."""
    return line[1].decode()


def event_of(line: list[bytes]) -> Event:
    """One event's line, its data left as JSON (decoded when read)."""
    event_id, job_id, etype, ts, text_at, data = line
    return Event(
        id=event_id.decode(),
        job_id=job_id.decode(),
        type=etype.decode(),
        ts=float(ts),
        raw=data,
        text_at=int(text_at),
    )


async def subscribe(pubsub: AsyncPubSub, channel: Channel) -> None:
    """Subscribe `pubsub` (of an asyncio client) to `channel`."""
    await pubsub.subscribe(_CHANNELS[channel])


def listen(client: redis.Redis, channel: Channel) -> PubSub:
    """A pub/sub of `client` subscribed to `channel` (close it when done)."""
    pubsub: PubSub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]  # redis-py: unannotated
    pubsub.subscribe(_CHANNELS[channel])
    return pubsub
