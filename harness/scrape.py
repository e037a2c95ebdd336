"""Reading `GET /metrics` in tests: parse a scrape, sum samples by labels, and check that
a job of a real kind was counted by every process on its path."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from jobs.wire import Job
from tuning.deployment import Deployment, wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(dep: Deployment) -> Samples:
    response = httpx.get(f"{dep.base_url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


JOB_HISTOGRAMS = ("queue_wait", "time_to_first_output", "end_to_end")


def check_job_counted(
    dep: Deployment,
    run: Callable[[], Job],
    kind: str,
    pipeline: str,
    histograms: tuple[str, ...] = JOB_HISTOGRAMS,
) -> None:
    """Run one job of `kind` (which must succeed) between two scrapes and check what moved:
    the API's submit count, the worker's end, the job histograms named (`mmq_job_{name}_
    seconds`), the batch histograms, and the worker's liveness."""
    before = scrape(dep)
    job = run()
    assert job["status"] == "succeeded", job
    labels = {"kind": kind, "pipeline": pipeline}
    after: Samples = {}

    def moved(name: str, **want: str) -> float:
        return value(after, name, **want) - value(before, name, **want)

    def counted() -> bool:
        nonlocal after
        after = scrape(dep)
        # Workers write what they counted once per `metrics_flush_s`.
        return (
            moved("mmq_jobs_finished_total", kind=kind, status="succeeded") >= 1
            and moved("mmq_batch_size_count", pipeline=pipeline) >= 1
        )

    wait_until(counted, timeout_s=10)
    assert moved("mmq_jobs_submitted_total", kind=kind) == 1
    for histogram in histograms:
        assert moved(f"mmq_job_{histogram}_seconds_count", **labels) >= 1, histogram
    assert moved("mmq_batch_size_count", pipeline=pipeline) >= 1
    assert moved("mmq_batch_duration_seconds_count", pipeline=pipeline) >= 1
    assert value(after, "mmq_worker_up", kind=kind, pipeline=pipeline) >= 1
