"""What workers read of their devices and backends, kept in Redis for `/metrics` and the
overview: each device's usage (`keys.device`, indexed in `keys.DEVICES`) and each
backend's gauges (`keys.backend`, indexed in `keys.BACKENDS`), both expiring so that a
gone worker's drop out."""

from __future__ import annotations

from collections.abc import Mapping

import redis

from jobs import keys
from jobstore.codec import flat_pairs, time_seconds


class ReadingsStore:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def write_backend(
        self, worker: str, fields: Mapping[str, str], values: Mapping[str, float], ttl_s: int
    ) -> None:
        """One backend's gauges (`values`) beside what it is (`fields`: host, worker,
        pipeline), kept `ttl_s`; one transaction, so a scrape never sees it half written."""
        key = keys.backend(worker)
        pipe = self.r.pipeline()
        pipe.delete(key)
        readings = {name: repr(v) for name, v in values.items()}
        pipe.hset(key, items=flat_pairs({**fields, **readings}))
        pipe.expire(key, ttl_s)
        pipe.zadd(keys.BACKENDS, {worker: time_seconds(self.r.time())})
        pipe.execute()

    def write_device(self, name: str, fields: Mapping[str, str], ttl_s: int) -> None:
        """One device's usage (`name`: `HOST/DEVICE`), kept `ttl_s`."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(keys.device(name), items=flat_pairs(dict(fields)))
        pipe.expire(keys.device(name), ttl_s)
        pipe.zadd(keys.DEVICES, {name: time_seconds(self.r.time())})
        pipe.execute()
