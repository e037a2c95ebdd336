"""`GET /metrics` on a real deployment: one scrape of the API sees what every process
counted (submits in the API, job ends and batches in the workers, cancels in the API),
queue depth by priority, live workers, GPU readings that workers stored, and each
pipeline's signals to scale on (a pipeline without workers, `nap`, until one starts)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from api.autoscale import desired_workers
from api.prometheus import Snapshot, render
from harness.api_client import Api
from harness.hosts import cpu_host_only
from harness.scrape import Samples, parse, scrape, value
from host.devices import Usage
from jobs.settings import Settings
from tuning.deployment import Deployment, flush, serving, wait_until
from workers.sampler import WorkerMetrics

NAP = """
[pipelines.nap]
kind = "sleep"
impl = "harness.pipelines:SleepPipeline"
max_batch = 1
runners = 2
concurrency = 2
"""
"""A second sleep pipeline (its jobs name it as their `model`), without a worker until
a test starts one."""
NAP_JOB: dict[str, Any] = {"model": "nap", "steps": 10, "step_ms": 100}
"""A job that runs a second at least: as long as the target wait (`deployment`)."""


@pytest.fixture(scope="module")
def deployment(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The tests' deployment (API, reaper, scheduler, an echo and a sleep worker), with
    `nap` beside them and a target wait of 1 s."""
    flush(redis_url)
    dep = Deployment(
        redis_url,
        tmp_path_factory.mktemp("deploy"),
        env_overrides={"MMQ_API__KEEPALIVE_S": "1", "MMQ_AUTOSCALE__TARGET_WAIT_S": "1"},
        config=NAP,
    )
    with serving(dep):
        dep.start(["echo", "sleep"])
        yield dep


def test_one_scrape_sees_jobs_queues_and_workers(deployment: Deployment, api: Api) -> None:
    before = scrape(deployment)
    long = api.submit("sleep", steps=1000, step_ms=60)  # busy for a minute: canceled below
    wait_until(lambda: api.get(long["id"])["status"] == "running", timeout_s=10)
    high = api.submit("sleep", priority="high", steps=1)
    low = api.submit("sleep", priority="low", steps=1)
    now = scrape(deployment)

    def waiting(priority: str) -> float:
        """In the worker's queue, or held by fair share until a slot frees."""
        held = value(now, "mmq_jobs_held", pipeline="sleep", priority=priority)
        return value(now, "mmq_queue_depth", kind="sleep", priority=priority) + held

    # The high job is pushed past the busy slot; the low one may be held until it frees.
    assert value(now, "mmq_queue_depth", kind="sleep", priority="high") == 1
    assert waiting("low") == 1
    assert waiting("normal") == 0
    assert value(now, "mmq_jobs_queued", kind="sleep") == 2
    assert value(now, "mmq_jobs_running") >= 1
    for pipeline in ("echo", "sleep"):
        assert value(now, "mmq_worker_up", pipeline=pipeline, device="cpu") == 1

    def echo(i: int) -> dict[str, Any]:
        inp = {"text": "f", "fail": True, "group": "f"} if i == 4 else {"text": f"m{i}"}
        job = api.submit("echo", **inp, tpot_ms=12.5, sleep_ms=100)
        return api.wait(job["id"])

    with ThreadPoolExecutor(5) as pool:
        echoes = list(pool.map(echo, range(5)))
    assert [j["status"] for j in echoes] == ["succeeded"] * 4 + ["failed"]
    for job in (high, low, long):  # the queued ones first: the worker is still busy
        assert api.http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
        assert api.wait(job["id"])["status"] == "canceled"

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    def counted() -> bool:
        nonlocal after
        after = scrape(deployment)
        return (
            moved("mmq_jobs_finished_total", kind="sleep", status="canceled") == 3
            and moved("mmq_jobs_finished_total", kind="echo") == 5
            and moved("mmq_batch_size_sum", pipeline="echo") == 5
            and moved("mmq_batch_duration_seconds_count", pipeline="sleep") == 1
        )

    after: Samples = {}
    # Workers write what they counted once per `metrics_flush_s`; the running job's cancel
    # is counted by its worker.
    wait_until(counted, timeout_s=10)
    assert moved("mmq_jobs_submitted_total", kind="echo") == 5
    assert moved("mmq_jobs_submitted_total", kind="sleep") == 3
    assert moved("mmq_jobs_finished_total", kind="echo", status="succeeded") == 4
    assert moved("mmq_jobs_finished_total", kind="echo", status="failed") == 1
    echo_labels = {"kind": "echo", "pipeline": "echo"}
    assert moved("mmq_job_end_to_end_seconds_count", **echo_labels) == 4
    assert moved("mmq_job_time_to_first_output_seconds_count", **echo_labels) == 4
    assert moved("mmq_job_queue_wait_seconds_count", **echo_labels) == 5
    assert moved("mmq_job_queue_wait_seconds_count", kind="sleep") == 1  # two never started
    assert moved("mmq_job_time_per_output_token_seconds_bucket", le="0.01", **echo_labels) == 0
    assert moved("mmq_job_time_per_output_token_seconds_bucket", le="0.015", **echo_labels) == 4
    assert abs(moved("mmq_job_time_per_output_token_seconds_sum", **echo_labels) - 0.05) < 1e-9
    end_to_end = moved("mmq_job_end_to_end_seconds_sum", **echo_labels)
    assert 0.4 <= end_to_end < 20  # four jobs of at least 100 ms each
    assert moved("mmq_batch_size_sum", pipeline="echo") == 5  # each job ran in one batch
    assert 2 <= moved("mmq_batch_size_count", pipeline="echo") <= 5
    assert moved("mmq_batch_duration_seconds_count", pipeline="sleep") == 1
    assert value(after, "mmq_jobs_queued", kind="sleep") == 0


def test_gpu_readings_from_workers_reach_the_scrape(
    deployment: Deployment, rclient: redis.Redis
) -> None:
    readings = {
        "gpu:0": Usage("gpu:0", "GPU-1c2f", "NVIDIA A100-SXM4-40GB", 3 * 2**30, 40 * 2**30, 0.75),
        "mig:MIG-0a6c": Usage("mig:MIG-0a6c", "MIG-0a6c", "MIG 1g.10gb", 2**30, 10 * 2**30, None),
    }
    for device in readings:
        sampler = WorkerMetrics(rclient, device, read=readings.get, host="gpuhost")
        assert sampler.sample_once()
    samples = scrape(deployment)
    gpu0 = {"host": "gpuhost", "device": "gpu:0", "uuid": "GPU-1c2f"}
    assert value(samples, "mmq_gpu_utilization_ratio", **gpu0) == 0.75
    assert value(samples, "mmq_gpu_memory_used_bytes", **gpu0) == 3 * 2**30
    assert value(samples, "mmq_gpu_memory_total_bytes", **gpu0) == 40 * 2**30
    mig = {"host": "gpuhost", "device": "mig:MIG-0a6c"}
    assert value(samples, "mmq_gpu_memory_used_bytes", **mig) == 2**30
    assert value(samples, "mmq_gpu_memory_total_bytes", **mig) == 10 * 2**30
    utilization = [ls for n, ls in samples if n == "mmq_gpu_utilization_ratio"]
    assert not any(("device", "mig:MIG-0a6c") in ls for ls in utilization)  # NVML has none


@cpu_host_only
def test_without_nvml_a_worker_reads_no_gpu(rclient: redis.Redis) -> None:
    sampler = WorkerMetrics(rclient, "gpu:0", interval_s=0.05)
    assert not sampler.sample_once()  # this machine has no NVML: nothing stored
    cpu = WorkerMetrics(rclient, "cpu")
    cpu.start()
    assert cpu._thread is None  # no GPU, no sampling thread
    sampler.start()
    assert sampler._thread is not None
    sampler._thread.join(30)  # no stop asked: the thread found nothing to read and ended
    assert not sampler._thread.is_alive()
    sampler.stop()


def test_histogram_buckets_are_made_cumulative() -> None:
    fields = {'["p","1.0"]': "2", '["p","4.0"]': "1", '["p","+Inf"]': "1", '["p","sum"]': "300"}
    samples = parse(render(Snapshot(recorded={"mmq_batch_size": fields}), Settings()).decode())
    p = {"pipeline": "p"}
    cumulative = [value(samples, "mmq_batch_size_bucket", le=b, **p) for b in ("1.0", "2.0", "4.0")]
    assert cumulative == [2, 2, 3]
    assert value(samples, "mmq_batch_size_bucket", le="+Inf", **p) == 4
    assert value(samples, "mmq_batch_size_count", **p) == 4
    assert value(samples, "mmq_batch_size_sum", **p) == 300


def nap(samples: Samples, signal: str) -> float:
    """`mmq_pipeline_SIGNAL` of the `nap` pipeline."""
    return value(samples, f"mmq_pipeline_{signal}", pipeline="nap")


def nap_worker(dep: Deployment) -> None:
    """A worker of `nap`, started unless one runs."""
    if not dep.pids("worker-nap-"):
        dep.start_worker("nap")


def nap_idle(dep: Deployment) -> bool:
    """Nothing waits or runs at `nap`, whose worker is live: it wants no worker."""
    samples = scrape(dep)
    signals = ("jobs_waiting", "oldest_wait_seconds", "jobs_running", "desired_workers")
    return nap(samples, "slots_live") == 2 and not any(nap(samples, s) for s in signals)


def test_a_pipeline_without_workers_queues_its_jobs_for_the_first_worker(
    deployment: Deployment, api: Api
) -> None:
    ready = httpx.get(f"{deployment.base_url}/readyz")
    assert ready.status_code == 200 and ready.json()["no_workers"] == ["nap"]
    jobs = [api.submit("sleep", **NAP_JOB) for _ in range(4)]  # each a 202 (or it raises)
    assert {job["status"] for job in jobs} == {"queued"}
    samples = scrape(deployment)
    assert nap(samples, "jobs_waiting") == 4
    assert nap(samples, "jobs_running") == nap(samples, "slots_live") == 0
    assert nap(samples, "desired_workers") == 1  # a backlog, no service time measured yet
    assert nap(samples, "service_seconds") == 0  # absent
    wait_until(lambda: nap(scrape(deployment), "oldest_wait_seconds") > 0)
    assert {api.get(job["id"])["status"] for job in jobs} == {"queued"}

    nap_worker(deployment)
    assert [api.wait(job["id"])["status"] for job in jobs] == ["succeeded"] * 4
    assert httpx.get(f"{deployment.base_url}/readyz").json()["no_workers"] == []
    wait_until(lambda: nap_idle(deployment))
    assert nap(scrape(deployment), "service_seconds") >= 1.0  # ten steps of 100 ms


def test_desired_workers_follow_a_burst(deployment: Deployment, api: Api) -> None:
    nap_worker(deployment)
    if not nap(scrape(deployment), "service_seconds"):  # run alone: measure it first
        api.wait(api.submit("sleep", **NAP_JOB)["id"])
        wait_until(lambda: nap(scrape(deployment), "service_seconds"))
    with ThreadPoolExecutor(4) as pool:
        jobs = list(pool.map(lambda _: api.submit("sleep", **NAP_JOB), range(12)))
    peak: Samples = {}

    def risen() -> bool:
        nonlocal peak
        peak = scrape(deployment)
        return nap(peak, "jobs_waiting") >= 1 and nap(peak, "desired_workers") >= 2

    # A job takes the target wait or longer: each job wants its own slot, so three jobs or
    # more want two workers of two slots.
    wait_until(risen)
    assert nap(peak, "oldest_wait_seconds") > 0
    queued, held = (
        value(peak, name, pipeline="nap") for name in ("mmq_queue_depth", "mmq_jobs_held")
    )
    assert nap(peak, "jobs_waiting") == queued + held  # in its queue, or held by fair share
    assert [api.wait(job["id"])["status"] for job in jobs] == ["succeeded"] * 12
    wait_until(lambda: nap_idle(deployment))


@pytest.mark.parametrize(
    ("waiting", "running", "service_s", "want"),
    [
        (0, 0, 2.0, 0),  # nothing to do: scale to zero
        (5, 0, None, 1),  # a backlog, no service time yet: one worker measures it
        (0, 9, None, 3),  # no service time: the workers of what runs
        (120, 0, 1.0, 1),  # 120 s of work: one worker's 4 slots do it in 30 s
        (121, 0, 1.0, 2),
        (10, 0, 60.0, 3),  # jobs longer than the target: a slot each, no more
        (10**6, 0, 10.0, 100),  # at most max_workers
    ],
)
def test_the_desired_workers_rule(
    waiting: int, running: int, service_s: float | None, want: int
) -> None:
    assert desired_workers(waiting, running, service_s, 4, 30.0, 100) == want
