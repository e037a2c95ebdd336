"""The S3 backend against a real S3 API server (moto over HTTP on loopback), and the API
and a worker configured with it."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from harness.api_client import new_owner
from harness.storage_servers import (
    AWS_ENV,
    BUCKET,
    MIB,
    add_file_pipeline,
    moto_s3,
    pattern_chunks,
    pattern_sha256,
)
from jobs.errors import InputError, NotFound, TooLarge
from jobs.settings import S3Settings, Settings
from storage.base import StorageConfigError
from storage.fetch import InputFetcher
from storage.refs import parse_ref
from storage.s3 import S3Storage
from tuning.deployment import Deployment, flush, serving


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3() as url:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield url


@pytest.fixture
def s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _config(endpoint: str, **extra: Any) -> S3Settings:
    values = {
        "endpoint_url": endpoint,
        "bucket": BUCKET,
        "prefix": f"t{secrets.token_hex(4)}/",
        "region": "us-east-1",
        "multipart_threshold_bytes": 5 * MIB,
        "multipart_chunk_bytes": 5 * MIB,
        **extra,
    }
    return S3Settings(**values)


@pytest.fixture
def store(endpoint: str) -> S3Storage:
    storage = S3Storage(_config(endpoint))
    storage.check()
    return storage


def test_round_trip_under_the_prefix(store: S3Storage, s3: Any) -> None:
    info = store.put("alice/uploads/u1/a.txt", b"hello s3", "text/plain")
    assert info.sha256 == hashlib.sha256(b"hello s3").hexdigest()
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=store.prefix)["Contents"]
    assert [o["Key"] for o in listed] == [f"{store.prefix}alice/uploads/u1/a.txt"]
    got = store.stat("alice/uploads/u1/a.txt")
    assert (got.size_bytes, got.content_type, got.sha256) == (8, "text/plain", info.sha256)
    with store.open("alice/uploads/u1/a.txt") as stream:
        assert stream.read() == b"hello s3"
    assert store.exists("alice/uploads/u1/a.txt")
    assert store.delete("alice/uploads/u1/a.txt") is True
    assert store.delete("alice/uploads/u1/a.txt") is False
    for call in (store.open, store.stat):
        with pytest.raises(NotFound):
            call("alice/uploads/u1/a.txt")
    with pytest.raises(InputError):
        store.put("../escape", b"x", "text/plain")


def test_large_objects_go_up_in_parts_and_stream_down(store: S3Storage, s3: Any) -> None:
    size = 12 * MIB + 5
    info = store.put("bob/jobs/j1/big.bin", pattern_chunks(size), "application/x-test")
    assert info.size_bytes == size and info.sha256 == pattern_sha256(size)
    head = s3.head_object(Bucket=BUCKET, Key=store.object_name("bob/jobs/j1/big.bin"))
    assert head["ETag"].strip('"').endswith("-3")
    assert head["ContentType"] == "application/x-test"
    sha = hashlib.sha256()
    for chunk in store.iter_chunks("bob/jobs/j1/big.bin", MIB):
        assert len(chunk) <= MIB
        sha.update(chunk)
    assert sha.hexdigest() == info.sha256


def test_too_large_aborts_the_multipart_upload(store: S3Storage, s3: Any) -> None:
    with pytest.raises(TooLarge):
        store.put("bob/uploads/u/x.bin", pattern_chunks(13 * MIB), "x/y", max_bytes=11 * MIB)
    assert not store.exists("bob/uploads/u/x.bin")
    assert s3.list_multipart_uploads(Bucket=BUCKET, Prefix=store.prefix).get("Uploads") is None


def test_delete_prefix_removes_a_job_folder_only(store: S3Storage, s3: Any) -> None:
    for name in range(5):
        store.put(f"carol/jobs/j7/{name}.txt", b"x", "text/plain")
    store.put("carol/jobs/j77/keep.txt", b"x", "text/plain")
    assert store.delete_prefix("carol/jobs/j7") == 5
    left = s3.list_objects_v2(Bucket=BUCKET, Prefix=store.prefix)["Contents"]
    assert [o["Key"] for o in left] == [f"{store.prefix}carol/jobs/j77/keep.txt"]


def test_presigned_urls(endpoint: str) -> None:
    store = S3Storage(_config(endpoint, public_endpoint_url="http://s3.public.test:9000"))
    store.put("dan/uploads/u/a.bin", b"presigned", "application/octet-stream")
    public = store.signed_url("dan/uploads/u/a.bin", 120)
    assert public.startswith(f"http://s3.public.test:9000/{BUCKET}/{store.prefix}dan/")
    assert "X-Amz-Expires=120" in public
    url = S3Storage(_config(endpoint, prefix=store.prefix)).signed_url("dan/uploads/u/a.bin", 60)
    assert httpx.get(url).content == b"presigned"
    # moto does not check presigned signatures or expiry; S3 does, from these parameters.
    assert "X-Amz-Expires=60&" in url and "X-Amz-Signature=" in url


def test_start_up_check_explains_a_missing_or_unreachable_bucket(endpoint: str) -> None:
    missing = S3Storage(_config(endpoint, bucket="no-such-bucket"))
    with pytest.raises(StorageConfigError, match=r"'no-such-bucket' .* does not exist"):
        missing.check()
    closed = S3Storage(_config("http://127.0.0.1:9", bucket=BUCKET))
    with pytest.raises(StorageConfigError, match="cannot reach S3"):
        closed.check()


def test_s3_urls_name_keys_on_the_configured_bucket_and_owner(endpoint: str) -> None:
    storage = {"backend": "s3", "s3": {"bucket": BUCKET, "prefix": "mmq", "endpoint_url": endpoint}}
    settings = Settings(storage=storage)
    ref = parse_ref(f"s3://{BUCKET}/mmq/alice/uploads/u/a.wav", "input.audio", "alice", settings)
    assert (ref.kind, ref.value) == ("key", "alice/uploads/u/a.wav")
    for url, reason in [
        ("s3://other-bucket/mmq/alice/u/a.wav", "must name the bucket"),
        (f"s3://{BUCKET}/elsewhere/alice/u/a.wav", "must be under"),
        (f"s3://{BUCKET}/mmq/bob/uploads/u/a.wav", "no stored file"),
        (f"s3://{BUCKET}/mmq/alice/../bob/a.wav", "segments"),
    ]:
        with pytest.raises(InputError, match=reason):
            parse_ref(url, "input.audio", "alice", settings)


def test_fetcher_copies_an_s3_object_to_a_temp_file(endpoint: str, tmp_path: Path) -> None:
    config = _config(endpoint)
    settings = Settings(data_dir=tmp_path, storage={"backend": "s3", "s3": config.model_dump()})
    storage = S3Storage(config)
    storage.put("erin/uploads/u/a.flac", b"fLaC" * 1000, "audio/flac")
    fetcher = InputFetcher(settings, storage)
    ref = f"s3://{BUCKET}/{config.prefix}erin/uploads/u/a.flac"
    with fetcher.local_path(ref, owner="erin", field="input.audio") as path:
        assert path.suffix == ".flac" and path.read_bytes() == b"fLaC" * 1000
    assert not path.exists()


@pytest.fixture(scope="module")
def s3_api(
    endpoint: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    flush(redis_url)
    env = {
        **AWS_ENV,
        "MMQ_STORAGE__BACKEND": "s3",
        "MMQ_STORAGE__S3__ENDPOINT_URL": endpoint,
        "MMQ_STORAGE__S3__BUCKET": BUCKET,
        "MMQ_STORAGE__S3__PREFIX": "api",
        "MMQ_STORAGE__S3__REGION": "us-east-1",
    }
    dep = Deployment(redis_url, tmp_path_factory.mktemp("s3api"), env_overrides=env)
    add_file_pipeline(dep)
    with serving(dep):
        dep.start(["filesum"], reaper=False)
        yield dep


def test_api_and_worker_on_s3(s3_api: Deployment, s3: Any) -> None:
    alice = new_owner(s3_api.redis_url, s3_api.base_url, "s3-alice")
    r = alice.http.post("/v1/files", files={"file": ("a.wav", b"RIFF-s3", "audio/wav")})
    assert r.status_code == 201, r.text
    key = r.json()["key"]
    assert s3.get_object(Bucket=BUCKET, Key=f"api/{key}")["Body"].read() == b"RIFF-s3"
    assert httpx.get(r.json()["url"]).content == b"RIFF-s3"
    download = alice.http.get(f"/v1/files/{key}")
    assert download.content == b"RIFF-s3" and download.headers["content-type"] == "audio/wav"
    bob = new_owner(s3_api.redis_url, s3_api.base_url, "s3-bob")
    assert bob.http.get(f"/v1/files/{key}").status_code == 404

    job = alice.submit("filesum", file=f"s3://{BUCKET}/api/{key}")
    done = alice.wait(job["id"])
    assert done["status"] == "succeeded", done
    digest = hashlib.sha256(b"RIFF-s3").hexdigest()
    assert done["output"]["sha256"] == digest
    assert httpx.get(done["output"]["file"]["url"]).content == digest.encode()

    assert alice.http.delete(f"/v1/files/{key}").status_code == 204
    assert alice.http.get(f"/v1/files/{key}").status_code == 404


def test_api_refuses_to_start_without_its_bucket(
    endpoint: str, redis_url: str, tmp_path: Path
) -> None:
    env = {
        **AWS_ENV,
        "MMQ_STORAGE__BACKEND": "s3",
        "MMQ_STORAGE__S3__ENDPOINT_URL": endpoint,
        "MMQ_STORAGE__S3__BUCKET": "not-created-here",
    }
    dep = Deployment(redis_url, tmp_path, env_overrides=env)
    with serving(dep):
        proc = dep.spawn("api", "api")
        assert proc.process.wait(timeout=30) != 0
        assert "bucket 'not-created-here'" in proc.log()
        assert "does not exist" in proc.log()
