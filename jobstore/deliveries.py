"""Each job's webhook delivery attempts (`keys.deliveries`): one JSON record an attempt,
written by the webhook worker (`cluster.webhooks`), read by `GET /v1/jobs/{id}/deliveries`
(`AsyncJobStore.deliveries`), kept as long as the job's record."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis

from jobs import keys


class DeliveryLog:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def add(self, job_id: str, record: Mapping[str, Any], ttl_s: int) -> None:
        pipe = self.r.pipeline()
        pipe.rpush(keys.deliveries(job_id), json.dumps(record))
        pipe.expire(keys.deliveries(job_id), ttl_s)
        pipe.execute()
