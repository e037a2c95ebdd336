"""The last few minutes, per minute, for the admin overview (`api/overview.py`).

The counters (`jobstore/metric_counts.py`) add up everything since the start, which is what
a Prometheus scrape wants; a console wants "now": jobs/s, p50 and p95 of the last minutes,
429s. So the same end and reject samples are also counted into one small hash per minute
(unix seconds // 60), `keys.recent(minute)`, that lives `KEEP_S`. Its fields are
`telemetry.metric_defs.field_of` of:

- `["ended", kind, pipeline, status]`: jobs that ended
- `["queue_wait", kind, pipeline, bucket]`: jobs that started, by queue wait (the buckets
  of `QUEUE_WAIT`, seconds; the bucket is its upper bound or `+Inf`)
- `["end_to_end", kind, pipeline, bucket]`: jobs that succeeded, by submit-to-end time
- `["rejected", kind, pipeline]`: submits refused with 429
- `["run_ms", kind, pipeline]` and `["runs", kind, pipeline]`: the run time (start to end,
  milliseconds) and the number of the jobs that succeeded or failed after they started:
  the service time that `/metrics`' desired workers use (`api/autoscale.py`)

They ride on the writes the counters make anyway: the worker's tally flush
(`MetricsTally.count`), the API's pipelined end and reject writes (`jobstore/store.py`,
metered). `read_counts` reads them back, summed over minutes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping

from jobs import keys
from jobs.states import JobStatus
from telemetry.metric_defs import END_TO_END, QUEUE_WAIT, MetricDef, Sample, bucket_of, field_of

KEEP_S = 900
"""A minute's hash lives this long: the overview's window is at most `KEEP_S - 60`."""

HISTOGRAMS: dict[str, MetricDef] = {"queue_wait": QUEUE_WAIT, "end_to_end": END_TO_END}
"""The series kept as histograms, with the metric whose buckets they use."""

RAN = (str(JobStatus.SUCCEEDED), str(JobStatus.FAILED))
"""The ends whose run time is a service time."""

Cell = tuple[str, str, int]
"""(hash key, field, count to add)."""

Counts = Counter[tuple[str, ...]]
"""Counts summed over minutes, by their field's values (`("ended", kind, pipeline,
status)`...)."""


def minute_of(ts: float) -> int:
    return int(ts // 60)


def end_cells(fields: Mapping[str, str | None], samples: Iterable[Sample]) -> list[Cell]:
    """The cells of a job that has just ended: its END_FIELDS and its end `samples`
    (`telemetry.metric_defs.end_samples`), counted in the minute it finished."""
    kind, pipeline = fields.get("kind") or "", fields.get("pipeline") or ""
    finished = fields.get("finished_at")
    if not finished:
        return []
    key = keys.recent(minute_of(float(finished)))
    cells = [(key, field_of(("ended", kind, pipeline, fields.get("status") or "")), 1)]
    for series, metric in HISTOGRAMS.items():
        for sample_metric, _labels, value in samples:
            if sample_metric is metric:
                bucket = bucket_of(metric, value)
                cells.append((key, field_of((series, kind, pipeline, bucket)), 1))
    return cells + run_cells(key, fields)


def run_cells(key: str, fields: Mapping[str, str | None]) -> list[Cell]:
    """The run time of a job that ran to its end (succeeded or failed; a canceled one's
    run was cut short), in the minute's hash `key`."""
    started, finished = fields.get("started_at"), fields.get("finished_at")
    if not started or not finished or fields.get("status") not in RAN:
        return []
    kind, pipeline = fields.get("kind") or "", fields.get("pipeline") or ""
    run_ms = max(0, round((float(finished) - float(started)) * 1000))
    return [
        (key, field_of(("run_ms", kind, pipeline)), run_ms),
        (key, field_of(("runs", kind, pipeline)), 1),
    ]


def rejected_cell(kind: str, pipeline: str, now: float) -> Cell:
    return keys.recent(minute_of(now)), field_of(("rejected", kind, pipeline)), 1


def add_up(minutes: Iterable[Mapping[str, str]]) -> Counts:
    """The counts of each minute's hash (as HGETALL gives it), summed."""
    counts: Counts = Counter()
    for fields in minutes:
        for name, value in fields.items():
            counts[tuple(json.loads(name))] += int(value)
    return counts
