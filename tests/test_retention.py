"""Retention: unused uploads go after their TTL, used ones with their jobs, job outputs with
their job records; run in-process on real Redis and storage, and by the reaper process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from cluster.retention import RetentionSweeper
from harness.storage_servers import file_tree
from jobs import keys
from jobs.settings import Settings
from jobstore.retention_index import RetentionIndex
from storage.base import job_folder, upload_key
from storage.factory import make_storage
from storage.s3 import S3Storage
from tuning.deployment import Deployment, flush, serving, wait_until

UPLOAD_TTL_S = 100


@pytest.fixture
def parts(redis_url: str, tmp_path: Path) -> tuple[redis.Redis, RetentionSweeper]:
    flush(redis_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    settings = Settings(
        redis_url=redis_url, data_dir=tmp_path, storage={"upload_ttl_s": UPLOAD_TTL_S}
    )
    return client, RetentionSweeper(client, make_storage(settings), settings)


def _job_record(client: redis.Redis, job_id: str, ttl_s: int | None) -> None:
    client.hset(keys.job(job_id), mapping={"status": "succeeded" if ttl_s else "running"})
    if ttl_s:
        client.expire(keys.job(job_id), ttl_s)


def test_unused_upload_goes_after_its_ttl(parts: tuple[redis.Redis, RetentionSweeper]) -> None:
    client, sweeper = parts
    key = upload_key("alice", "a.wav")
    sweeper.storage.put(key, b"x", "audio/wav")
    now = time.time()
    RetentionIndex(client).note_upload(key, now + UPLOAD_TTL_S)
    assert sweeper.sweep(now).uploads_deleted == 0
    assert sweeper.storage.exists(key)
    assert sweeper.sweep(now + UPLOAD_TTL_S + 1).uploads_deleted == 1
    assert not sweeper.storage.exists(key)
    assert client.zcard(keys.UPLOADS) == 0


def test_used_upload_stays_while_a_job_that_used_it_does(
    parts: tuple[redis.Redis, RetentionSweeper],
) -> None:
    client, sweeper = parts
    key = upload_key("bob", "b.wav")
    sweeper.storage.put(key, b"x", "audio/wav")
    now = time.time()
    RetentionIndex(client).note_upload(key, now - 1)
    client.sadd(keys.upload_jobs(key), "job_ended", "job_running", "job_gone")
    _job_record(client, "job_ended", 500)
    _job_record(client, "job_running", None)
    assert sweeper.sweep(now).uploads_deleted == 0
    next_look = client.zscore(keys.UPLOADS, key)  # a running job: look again in an hour
    assert next_look is not None and next_look >= now + sweeper.recheck_s
    client.delete(keys.job("job_running"))
    assert sweeper.sweep(next_look).uploads_deleted == 0  # the ended one still lives
    next_look = client.zscore(keys.UPLOADS, key)
    assert next_look is not None and next_look >= now + sweeper.recheck_s + 400
    client.delete(keys.job("job_ended"))
    assert sweeper.sweep(next_look).uploads_deleted == 1
    assert not sweeper.storage.exists(key)
    assert not client.exists(keys.upload_jobs(key))


def test_job_outputs_go_with_the_job_record(parts: tuple[redis.Redis, RetentionSweeper]) -> None:
    client, sweeper = parts
    RetentionIndex(client).note_artifacts(job_folder("carol", "job_1"))
    RetentionIndex(client).note_artifacts(job_folder("carol", "job_2"))
    for job_id in ("job_1", "job_2"):
        for name in ("a.wav", "b.png"):
            sweeper.storage.put(f"{job_folder('carol', job_id)}/{name}", b"x", "x/y")
    _job_record(client, "job_1", 60)
    report = sweeper.sweep(time.time())
    assert (report.artifact_folders_deleted, report.files_deleted) == (1, 2)
    root = sweeper.storage.root / "objects"  # type: ignore[attr-defined]
    assert file_tree(root) == ["carol/jobs/job_1/a.wav", "carol/jobs/job_1/b.png"]
    client.delete(keys.job("job_1"))
    assert sweeper.sweep(time.time() + 120).artifact_folders_deleted == 1
    assert file_tree(root) == []
    assert client.zcard(keys.ARTIFACTS) == 0


def test_unreachable_storage_keeps_entries_for_later(redis_url: str) -> None:
    flush(redis_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    s3 = {"endpoint_url": "http://127.0.0.1:9", "bucket": "mmq-x", "region": "us-east-1"}
    settings = Settings(redis_url=redis_url, storage={"backend": "s3", "s3": s3})
    storage = S3Storage(settings.storage.s3)
    RetentionIndex(client).note_upload("dave/uploads/u/a.wav", time.time() - 1)
    report = RetentionSweeper(client, storage, settings).sweep()
    assert report.uploads_deleted == 0
    next_look = client.zscore(keys.UPLOADS, "dave/uploads/u/a.wav")
    assert next_look is not None and next_look > time.time()


def test_the_reaper_process_runs_the_sweep(redis_url: str, tmp_path: Path) -> None:
    flush(redis_url)
    env = {"MMQ_STORAGE__SWEEP_INTERVAL_S": "0.2"}
    dep = Deployment(redis_url, tmp_path, env_overrides=env)
    settings = Settings(redis_url=redis_url, data_dir=tmp_path / "data")
    storage = make_storage(settings)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    key = upload_key("erin", "old.wav")
    storage.put(key, b"old", "audio/wav")
    storage.put(f"{job_folder('erin', 'job_gone')}/out.wav", b"out", "audio/wav")
    RetentionIndex(client).note_upload(key, time.time() - 1)
    RetentionIndex(client).note_artifacts(job_folder("erin", "job_gone"))
    with serving(dep):
        proc = dep.start_reaper()
        wait_until(lambda: not storage.exists(key), proc, timeout_s=15)
        wait_until(lambda: client.zcard(keys.ARTIFACTS) == 0, proc, timeout_s=15)
    assert file_tree(tmp_path / "data" / "storage" / "objects") == []
