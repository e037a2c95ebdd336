"""The pub/sub notices that the store's scripts publish (`jobstore/lua.py`), and the
channels they go on: one notice per event of any job on the events channel (or one JSON
array of the notices of the events written together), and each job's terminal status
notice again, with the job's fields unless they are large (`lua.NOTICE_JOB_MAX_BYTES`),
on the ends channel. A subscriber names a channel by what it carries (`Channel`); its
Redis name stays here (`keys.EVENTS_CHANNEL`, `keys.ENDS_CHANNEL`).

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

Channel = Literal["events", "ends"]
_CHANNELS: dict[Channel, str] = {"events": keys.EVENTS_CHANNEL, "ends": keys.ENDS_CHANNEL}


class Notice(TypedDict, total=False):
    """One notice as published: an event's fields (`jobs.models.Event`), and on the ends
    channel the job's fields as its hash holds them (`job`, absent when large)."""

    id: str
    job_id: str
    type: str
    data: dict[str, JsonValue]
    ts: float
    job: dict[str, str]


async def subscribe(pubsub: AsyncPubSub, channel: Channel) -> None:
    """Subscribe `pubsub` (of an asyncio client) to `channel`."""
    await pubsub.subscribe(_CHANNELS[channel])


def listen(client: redis.Redis, channel: Channel) -> PubSub:
    """A pub/sub of `client` subscribed to `channel` (close it when done)."""
    pubsub: PubSub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]  # redis-py: unannotated
    pubsub.subscribe(_CHANNELS[channel])
    return pubsub
