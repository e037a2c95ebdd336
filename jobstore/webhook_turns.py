"""The order of a job's webhook deliveries: a delivery goes when those of the job's
earlier events that its webhook wants have ended (delivered, or given up), so that a
receiver gets `queued` before `running`, and every partial in the stream's order.

Deliveries are tasks that the webhook worker's threads run at once, and a job's events
are sent by several processes (the API sends `queued`, a worker `running`): the job's
event stream, not the order the tasks come in, says which event is earlier. A delivery
that finds an earlier one not ended waits (`cluster.webhooks` sends its task again a
moment later); past `webhooks.order_wait_s` it goes anyway (an earlier delivery that is
stuck, or was never sent, holds nothing up for longer), and the ids still give the order.
"""

from __future__ import annotations

import json
from typing import cast

import redis

from jobs import keys
from jobs.models import WebhookSpec
from jobs.webhooks import wants


def _parts(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


class WebhookTurns:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def earlier_pending(self, job_id: str, event_id: str) -> bool:
        """Whether an event of the job before `event_id` that its webhook gets has a
        delivery that has not ended."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hget(keys.job(job_id), "webhook")
        pipe.get(keys.webhook_cursor(job_id))
        spec, cursor = cast(list[str | None], pipe.execute())
        if not spec:
            return False  # the job's record is gone
        events = WebhookSpec.model_validate_json(spec).events
        start = f"({cursor}" if cursor else "-"
        # A decoding client's reply (as every mmq client's: `jobstore.codec`).
        entries = cast(
            list[tuple[str, dict[str, str]]],
            self.r.xrange(keys.job_events(job_id), start, f"({event_id}"),
        )
        wanted = [
            eid for eid, fields in entries
            if wants(events, fields["type"], json.loads(fields["data"]))
        ]  # fmt: skip
        if not wanted:
            return False
        pipe = self.r.pipeline(transaction=False)
        for eid in wanted:
            pipe.sismember(keys.webhook_done(job_id), eid)
        return not all(pipe.execute())

    def ended(self, job_id: str, event_id: str, ttl_s: int) -> None:
        """The delivery of `event_id` has ended: later ones may go. Moves the cursor up to
        it (never back: a delivery that went ahead past its wait may end after a later one)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.sadd(keys.webhook_done(job_id), event_id)
        pipe.expire(keys.webhook_done(job_id), ttl_s)
        pipe.get(keys.webhook_cursor(job_id))
        cursor = cast(str | None, pipe.execute()[-1])
        if cursor is None or _parts(cursor) < _parts(event_id):
            self.r.set(keys.webhook_cursor(job_id), event_id, ex=ttl_s)
