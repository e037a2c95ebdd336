"""The file routes and file inputs of jobs, against a real deployment on the local backend."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import redis

from harness.api_client import Api, new_owner
from harness.storage_servers import (
    MIB,
    add_file_pipeline,
    file_tree,
    http_server,
    pattern_chunks,
    proc_status_kib,
    raw_request,
    reset_peak_rss,
)
from jobs import keys
from storage.signing import Signer
from tuning.deployment import Deployment, flush, serving

MAX_UPLOAD_BYTES = 66 * MIB


@pytest.fixture(scope="module")
def files_dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    env = {"MMQ_STORAGE__MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES)}
    dep = Deployment(redis_url, tmp_path_factory.mktemp("files"), env_overrides=env)
    add_file_pipeline(dep)
    with serving(dep):
        dep.start(["filesum"], reaper=False)
        yield dep


@pytest.fixture
def alice(files_dep: Deployment) -> Api:
    return new_owner(files_dep.redis_url, files_dep.base_url, f"alice{time.monotonic_ns()}")


def _objects(dep: Deployment) -> Path:
    return dep.tmp / "data" / "storage" / "objects"


def _upload(api: Api, data: bytes, name: str = "a.wav", ctype: str = "audio/wav") -> dict[str, str]:
    r = api.http.post("/v1/files", files={"file": (name, data, ctype)})
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_upload_then_download_by_key_and_by_signed_url(files_dep: Deployment, alice: Api) -> None:
    data = b"RIFF" + bytes(range(256)) * 10
    r = alice.http.post("/v1/files", files={"file": ("my voice.wav", data, "audio/wav")})
    assert r.status_code == 201, r.text
    body = r.json()
    assert set(body) == {"key", "bytes", "content_type", "sha256", "url"}
    assert body["bytes"] == len(data) and body["content_type"] == "audio/wav"
    assert body["sha256"] == hashlib.sha256(data).hexdigest()
    assert body["key"].split("/")[1] == "uploads" and body["key"].endswith("/my_voice.wav")
    assert r.headers["location"] == f"/v1/files/{body['key']}"

    got = alice.http.get(f"/v1/files/{body['key']}")
    assert got.status_code == 200 and got.content == data
    assert got.headers["content-type"] == "audio/wav"
    assert got.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in got.headers["content-security-policy"]
    anonymous = httpx.get(body["url"])
    assert anonymous.status_code == 200 and anonymous.content == data


def test_signed_urls_expire_and_resist_tampering(files_dep: Deployment, alice: Api) -> None:
    key = _upload(alice, b"signed")["key"]
    url = _upload(alice, b"other")["url"]
    query = parse_qs(urlsplit(url).query)
    expires, signature = query["expires"][0], query["signature"][0]
    base = f"{files_dep.base_url}/v1/files/{key}"
    secret = (files_dep.tmp / "data" / "storage" / "signing.key").read_bytes()
    old_expires, old_signature = Signer(secret).sign(key, 5, now=time.time() - 60)
    cases = {
        "other key's signature": f"{base}?expires={expires}&signature={signature}",
        "no signature": f"{base}?expires={expires}",
        "bad signature": f"{base}?expires={expires}&signature={'0' * 64}",
        "expired": f"{base}?expires={old_expires}&signature={old_signature}",
        "moved expiry": f"{base}?expires={old_expires + 3600}&signature={old_signature}",
        "garbage expiry": f"{base}?expires=soon&signature={old_signature}",
    }
    for case, target in cases.items():
        r = httpx.get(target)
        assert r.status_code == 401, (case, r.text)
        assert r.json()["error"]["type"] == "unauthorized"
    assert "expired" in httpx.get(cases["expired"]).json()["error"]["message"]
    fresh_expires, fresh_signature = Signer(secret).sign(key, 60)
    assert httpx.get(f"{base}?expires={fresh_expires}&signature={fresh_signature}").content == (
        b"signed"
    )


def test_another_owner_gets_404_and_no_key_gets_401(files_dep: Deployment, alice: Api) -> None:
    key = _upload(alice, b"private")["key"]
    bob = new_owner(files_dep.redis_url, files_dep.base_url, f"bob{time.monotonic_ns()}")
    assert bob.http.get(f"/v1/files/{key}").status_code == 404
    assert bob.http.delete(f"/v1/files/{key}").status_code == 404
    missing = key.rsplit("/", 1)[0] + "/nothing.wav"
    assert alice.http.get(f"/v1/files/{missing}").status_code == 404
    anonymous = httpx.Client(base_url=files_dep.base_url)
    assert anonymous.get(f"/v1/files/{key}").status_code == 401
    assert anonymous.post("/v1/files", files={"file": ("a", b"x")}).status_code == 401
    assert alice.http.get(f"/v1/files/{key}").content == b"private"


def test_paths_never_leave_the_data_directory(files_dep: Deployment, alice: Api) -> None:
    outside = files_dep.tmp / "outside.txt"
    outside.write_text("secret outside the data dir")
    owner = _upload(alice, b"x")["key"].split("/")[0]
    planted = _objects(files_dep) / owner / "uploads" / "planted"
    planted.mkdir(parents=True)
    (planted / "link.txt").symlink_to(outside)
    (planted / "dir").symlink_to(files_dep.tmp)
    auth = alice.http.headers["authorization"]
    secret = (files_dep.tmp / "data" / "storage" / "signing.key").read_bytes()
    link_key = f"{owner}/uploads/planted/link.txt"
    expires, signature = Signer(secret).sign(link_key, 60)
    targets = [
        "/v1/files/../../../../etc/passwd",
        "/v1/files/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        f"/v1/files/{owner}%2F..%2F..%2F..%2Foutside.txt",
        f"/v1/files/{owner}/uploads/..%2f..%2f..%2f..%2foutside.txt",
        "/v1/files//etc/passwd",
        "/v1/files/%2Fetc%2Fpasswd",
        f"/v1/files/{owner}/uploads/%00/x",
        f"/v1/files/{owner}/uploads/x%00.txt",
        f"/v1/files/{owner}%5C..%5C..%5Coutside.txt",
        f"/v1/files/{owner}/%252e%252e/outside.txt",
        f"/v1/files/{link_key}",
        f"/v1/files/{owner}/uploads/planted/dir/outside.txt",
        f"/v1/files/{link_key}?expires={expires}&signature={signature}",
    ]
    for target in targets:
        for method in ("GET", "DELETE"):
            status = raw_request(files_dep.base_url, method, target, {"Authorization": auth})
            assert status in {400, 404, 422}, (method, target, status)
    assert outside.read_text() == "secret outside the data dir"
    assert (planted / "link.txt").is_symlink()


def test_uploads_over_the_limit_get_413_and_leave_nothing(
    files_dep: Deployment, alice: Api
) -> None:
    before = file_tree(_objects(files_dep))
    huge = {"Authorization": alice.http.headers["authorization"], "Content-Length": str(10**10)}
    huge["Content-Type"] = "multipart/form-data; boundary=x"
    assert raw_request(files_dep.base_url, "POST", "/v1/files", huge) == 413

    just_over = alice.http.post(
        "/v1/files", files={"file": ("big.bin", b"\0" * (MAX_UPLOAD_BYTES + 1), "x/y")}
    )
    assert just_over.status_code == 413, just_over.text
    assert just_over.json()["error"]["param"] == "file"

    def endless() -> Iterator[bytes]:
        yield b"--x\r\nContent-Disposition: form-data; name=file; filename=a\r\n\r\n"
        yield from pattern_chunks(MAX_UPLOAD_BYTES + 4 * MIB)

    headers = {"Content-Type": "multipart/form-data; boundary=x"}
    streamed = alice.http.post("/v1/files", content=endless(), headers=headers)
    assert streamed.status_code == 413
    assert file_tree(_objects(files_dep)) == before
    assert list((files_dep.tmp / "data" / "storage" / "tmp").iterdir()) == []


def test_bad_upload_requests_get_4xx(alice: Api) -> None:
    r = alice.http.post("/v1/files", json={"file": "not multipart"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "file"
    r = alice.http.post("/v1/files", data={"file": "a plain field"})
    assert r.status_code == 422
    two = [("file", ("a", b"1")), ("file", ("b", b"2"))]
    assert alice.http.post("/v1/files", files=two).status_code == 400


def test_large_uploads_and_downloads_stream_through_the_api(
    files_dep: Deployment, alice: Api, tmp_path: Path
) -> None:
    size = 64 * MIB
    source = tmp_path / "big.bin"
    sha = hashlib.sha256()
    with source.open("wb") as out:
        for chunk in pattern_chunks(size):
            sha.update(chunk)
            out.write(chunk)
    pid = next(p.process.pid for p in files_dep.procs if p.name == "api")
    rss_kib = proc_status_kib(pid, "VmRSS")
    reset_peak_rss(pid)
    with source.open("rb") as stream:
        r = alice.http.post("/v1/files", files={"file": ("big.bin", stream, "x/y")})
    assert r.status_code == 201, r.text
    assert r.json()["sha256"] == sha.hexdigest() and r.json()["bytes"] == size
    upload_peak_kib = proc_status_kib(pid, "VmHWM")

    reset_peak_rss(pid)
    got = hashlib.sha256()
    with alice.http.stream("GET", f"/v1/files/{r.json()['key']}") as response:
        assert response.headers["content-length"] == str(size)
        for chunk in response.iter_bytes():
            got.update(chunk)
    assert got.hexdigest() == sha.hexdigest()
    download_peak_kib = proc_status_kib(pid, "VmHWM")
    limit_kib = rss_kib + 24 * 1024  # far below the 64 MiB file
    assert upload_peak_kib < limit_kib, (rss_kib, upload_peak_kib)
    assert download_peak_kib < limit_kib, (rss_kib, download_peak_kib)


def test_jobs_read_uploads_and_write_outputs(
    files_dep: Deployment, alice: Api, rclient: redis.Redis
) -> None:
    data = b"audio bytes " * 1000
    key = _upload(alice, data)["key"]
    job = alice.submit("filesum", file=key)
    done = alice.wait(job["id"])
    assert done["status"] == "succeeded", done
    digest = hashlib.sha256(data).hexdigest()
    assert done["output"]["sha256"] == digest and done["output"]["bytes"] == len(data)
    out = done["output"]["file"]
    assert out["key"] == f"{key.split('/')[0]}/jobs/{job['id']}/sum.txt"
    assert httpx.get(out["url"]).content == digest.encode()
    assert alice.http.get(f"/v1/files/{out['key']}").content == digest.encode()

    assert rclient.smembers(keys.upload_jobs(key)) == {job["id"]}
    assert rclient.zscore(keys.UPLOADS, key) is not None
    assert rclient.zscore(keys.ARTIFACTS, out["key"].rsplit("/", 1)[0]) is not None


def test_job_inputs_are_checked_at_submit(files_dep: Deployment, alice: Api) -> None:
    bob = new_owner(files_dep.redis_url, files_dep.base_url, f"bob{time.monotonic_ns()}")
    bobs_key = _upload(bob, b"bob's")["key"]
    mine = _upload(alice, b"mine")["key"]
    with http_server() as local_url:
        cases = [
            ({"file": bobs_key}, "input.file", "no stored file"),
            ({"file": mine + ".missing"}, "input.file", "no stored file"),
            ({"file": "../../etc/passwd"}, "input.file", "segments"),
            ({"file": f"{local_url}/bytes/10"}, "input.file", "loopback"),
            ({"file": "http://169.254.169.254/latest"}, "input.file", "link-local"),
            ({"file": "s3://bucket/a.wav"}, "input.file", "s3 storage backend"),
            ({"file": "file:///etc/passwd"}, "input.file", "stored file key"),
            ({"file": mine, "extra": bobs_key}, "input.extra", "no stored file"),
        ]
        for inp, param, reason in cases:
            r = alice.http.post("/v1/jobs", json={"kind": "filesum", "input": inp})
            assert r.status_code == 422, (inp, r.text)
            assert r.json()["error"]["param"] == param
            assert reason in r.json()["error"]["message"], r.json()
    assert alice.http.get("/v1/jobs").json()["data"] == []


def test_owner_deletes_an_upload(files_dep: Deployment, alice: Api, rclient: redis.Redis) -> None:
    key = _upload(alice, b"bye")["key"]
    assert rclient.zscore(keys.UPLOADS, key) is not None
    assert alice.http.delete(f"/v1/files/{key}").status_code == 204
    assert alice.http.get(f"/v1/files/{key}").status_code == 404
    assert alice.http.delete(f"/v1/files/{key}").status_code == 404
    assert rclient.zscore(keys.UPLOADS, key) is None
    assert not (_objects(files_dep) / key).exists()
