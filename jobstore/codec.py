"""Job records to and from Redis hashes: JSON for nested values, plain strings for the rest."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import orjson
from pydantic import JsonValue

from jobs.models import Event, Job

_JSON_FIELDS = ("input", "output", "error", "metadata", "extra_timings", "webhook", "batch")
_FLOAT_FIELDS = (
    "created_at", "queued_at", "started_at", "first_output_at", "finished_at", "deadline",
)  # fmt: skip
_BOOL_FIELDS = ("cancel_requested", "cancel_at_deadline")


def dumps(value: Any) -> str:
    """Compact JSON text, UTF-8 as it is (every event's data goes through here)."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def job_to_fields(job: Job) -> dict[str, str]:
    raw = job.model_dump(mode="json")
    out: dict[str, str] = {}
    for key, value in raw.items():
        if key == "traceparent" and value is None:
            continue  # tracing off: no field at all
        if key in _JSON_FIELDS:
            out[key] = "" if value is None else dumps(value)
        elif key in _BOOL_FIELDS:
            out[key] = "1" if value else "0"
        else:
            out[key] = "" if value is None else str(value)
    return out


def job_from_fields(fields: dict[str, str]) -> Job:
    data: dict[str, JsonValue] = {}
    for key, value in fields.items():
        if key in _JSON_FIELDS:
            data[key] = orjson.loads(value) if value else None
        elif key in _FLOAT_FIELDS:
            data[key] = float(value) if value else None
        elif key in _BOOL_FIELDS:
            data[key] = value == "1"
        elif key == "attempts":
            data[key] = int(value)
        elif key == "worker":
            data[key] = value or None
        else:
            data[key] = value
    data["metadata"] = data.get("metadata") or {}
    data["extra_timings"] = data.get("extra_timings") or {}
    return Job.model_validate(data)


def flat_pairs(fields: dict[str, str]) -> list[str]:
    pairs: list[str] = []
    for key, value in fields.items():
        pairs += [key, value]
    return pairs


def event_from_entry(job_id: str, entry_id: str, fields: dict[str, str]) -> Event:
    return Event(
        id=entry_id,
        job_id=job_id,
        type=fields["type"],
        raw=fields["data"].encode(),  # decoded when read (`Event.data`)
        ts=float(fields["ts"]),
    )


# redis-py types every reply as `bytes | str` whatever `decode_responses` says; mmq's
# clients decode, so their replies are text. These say so to the type checker (no copy).


def text_map(reply: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    return cast(dict[str, str], reply)


def text_list(reply: Iterable[Any]) -> list[str]:
    return cast(list[str], list(reply))


def time_seconds(reply: Sequence[int]) -> float:
    """Redis's `TIME` reply (seconds, microseconds) as seconds: the one clock that leases,
    deadlines and heartbeats are measured in, whatever a host's own clock says."""
    seconds, micros = reply
    return float(seconds) + micros / 1e6
