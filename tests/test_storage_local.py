"""The local backend, key rules and signed URLs, on a real directory."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import threading
import tracemalloc
from pathlib import Path

import pytest

from harness.storage_servers import MIB, file_tree, pattern_chunks, pattern_sha256
from jobs.errors import InputError, NotFound, TooLarge
from jobs.settings import Settings
from storage.base import job_key, owner_prefix, safe_name, upload_key, validate_key
from storage.factory import make_signer, make_storage
from storage.local import LocalStorage
from storage.signing import SignatureError, Signer, load_or_create_secret

SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def store(tmp_path: Path) -> LocalStorage:
    storage = LocalStorage(tmp_path / "storage", Signer(SECRET), "http://api.test")
    storage.check()
    return storage


def test_round_trip_of_bytes_stream_and_chunks(store: LocalStorage) -> None:
    data = b"hello, storage"
    info = store.put("alice/uploads/u1/a.txt", data, "text/plain")
    assert info.size_bytes == len(data)
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert store.exists("alice/uploads/u1/a.txt")
    with store.open("alice/uploads/u1/a.txt") as stream:
        assert stream.read() == data
    stat_info = store.stat("alice/uploads/u1/a.txt")
    assert (stat_info.content_type, stat_info.sha256, stat_info.size_bytes) == (
        "text/plain",
        info.sha256,
        len(data),
    )

    store.put("alice/jobs/j1/b.bin", io.BytesIO(b"x" * 3000), "application/octet-stream")
    store.put("alice/jobs/j1/c.bin", iter([b"ab", b"", b"cd"]), "audio/wav")
    assert b"".join(store.iter_chunks("alice/jobs/j1/b.bin", 1024)) == b"x" * 3000
    assert store.stat("alice/jobs/j1/c.bin").content_type == "audio/wav"
    assert b"".join(store.iter_chunks("alice/jobs/j1/c.bin")) == b"abcd"

    store.put("alice/uploads/u1/a.txt", b"new", "text/csv")
    assert store.stat("alice/uploads/u1/a.txt").content_type == "text/csv"
    assert b"".join(store.iter_chunks("alice/uploads/u1/a.txt")) == b"new"


def test_delete_and_delete_prefix_leave_no_trace(store: LocalStorage) -> None:
    for name in ("a", "b", "c"):
        store.put(f"bob/jobs/j9/{name}.txt", name.encode(), "text/plain")
    store.put("bob/uploads/u2/keep.txt", b"k", "text/plain")
    assert store.delete("bob/jobs/j9/a.txt") is True
    assert store.delete("bob/jobs/j9/a.txt") is False
    assert not store.exists("bob/jobs/j9/a.txt")
    assert store.delete_prefix("bob/jobs/j9/") == 2
    assert store.delete_prefix("bob/jobs/j9") == 0
    assert file_tree(store.objects) == ["bob/uploads/u2/keep.txt"]
    assert file_tree(store.meta) == ["bob/uploads/u2/keep.txt.json"]
    assert not (store.objects / "bob" / "jobs").exists()


def test_missing_objects_are_not_found(store: LocalStorage) -> None:
    store.put("carol/uploads/u/x.bin", b"x", "application/octet-stream")
    for key in ("carol/uploads/u/y.bin", "carol/uploads/u", "carol"):
        with pytest.raises(NotFound):
            store.open(key)
        with pytest.raises(NotFound):
            store.stat(key)
        assert not store.exists(key)


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/etc/passwd",
        "../etc/passwd",
        "alice/../../etc/passwd",
        "alice/./x",
        "alice//x",
        "alice/x/",
        "alice\\..\\x",
        "alice/x\x00.txt",
        "alice/.hidden",
        "alice/%2e%2e/x",
        "alice/sp ace",
        "alice/" + "a" * 129,
        "a/" * 300,
    ],
)
def test_keys_that_could_leave_the_root_are_refused(store: LocalStorage, key: str) -> None:
    with pytest.raises(InputError) as caught:
        validate_key(key)
    assert caught.value.field == "key"
    with pytest.raises(InputError):
        store.put(key, b"x", "text/plain")
    with pytest.raises(InputError):
        store.open(key)
    assert file_tree(store.objects) == []


def test_symlinks_never_lead_outside(store: LocalStorage, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (store.objects / "eve" / "uploads").mkdir(parents=True)
    (store.objects / "eve" / "uploads" / "link.txt").symlink_to(secret)
    (store.objects / "eve" / "jobs").symlink_to(tmp_path)
    for key in ("eve/uploads/link.txt", "eve/jobs/secret.txt"):
        with pytest.raises(NotFound):
            store.open(key)
        with pytest.raises(NotFound):
            store.stat(key)
    with pytest.raises(NotFound):
        store.put("eve/jobs/new.txt", b"x", "text/plain")
    assert store.delete_prefix("eve/jobs") == 0
    assert secret.read_text() == "top secret"
    assert not (tmp_path / "new.txt").exists()


def test_size_limit_refuses_and_leaves_nothing(store: LocalStorage) -> None:
    with pytest.raises(TooLarge):
        store.put("dan/uploads/u/big.bin", pattern_chunks(3 * MIB), "x/y", max_bytes=2 * MIB)
    store.put("dan/uploads/u/ok.bin", b"x" * 100, "x/y", max_bytes=100)
    assert file_tree(store.objects) == ["dan/uploads/u/ok.bin"]
    assert list(store.tmp.iterdir()) == []


def test_content_types_are_checked(store: LocalStorage) -> None:
    assert store.put("dan/u/a", b"", "").content_type == "application/octet-stream"
    for bad in ("text", "text/plain\r\nX-Evil: 1", "a b/c"):
        with pytest.raises(InputError):
            store.put("dan/u/a", b"", bad)


def test_put_and_read_stream_a_large_file_in_bounded_memory(store: LocalStorage) -> None:
    size = 64 * MIB
    tracemalloc.start()
    try:
        info = store.put("big/uploads/u/big.bin", pattern_chunks(size), "x/y")
        _, put_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        sha = hashlib.sha256()
        for chunk in store.iter_chunks("big/uploads/u/big.bin"):
            sha.update(chunk)
        _, read_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.size_bytes == size and info.sha256 == pattern_sha256(size)
    assert sha.hexdigest() == info.sha256
    assert put_peak < 8 * MIB, put_peak
    assert read_peak < 8 * MIB, read_peak


def test_key_helpers() -> None:
    key = upload_key("alice", "../../My Song (final).WAV")
    owner, kind, upload_id, name = key.split("/")
    assert (owner, kind, name) == ("alice", "uploads", "My_Song_final_.WAV")
    assert len(upload_id) == 32 and validate_key(key) == key
    assert upload_key("alice", "a") != upload_key("alice", "a")
    assert job_key("bob", "job_123", "out.wav") == "bob/jobs/job_123/out.wav"
    assert owner_prefix("bob") == "bob/"
    assert safe_name("..") == "file" and safe_name(None) == "file"
    assert safe_name("x" * 300 + ".flac").endswith("x.flac")
    with pytest.raises(InputError):
        job_key("bob", "../job", "x")
    with pytest.raises(InputError):
        owner_prefix("a/b")


def test_signatures_expire_and_resist_tampering(store: LocalStorage) -> None:
    signer = Signer(SECRET)
    expires, signature = signer.sign("a/b.txt", 60, now=1000)
    assert expires == 1060
    signer.verify("a/b.txt", str(expires), signature, now=1060)
    cases = [
        ("a/b.txt", str(expires), signature, 1061, "expired"),
        ("a/c.txt", str(expires), signature, 1000, "does not match"),
        ("a/b.txt", str(expires + 1), signature, 1000, "does not match"),
        ("a/b.txt", str(expires), signature[:-1] + "0", 1000, "does not match"),
        ("a/b.txt", "-5", signature, 1000, "not a unix time"),
        ("a/b.txt", "", "", 1000, "not a unix time"),
    ]
    for key, exp, sig, now, reason in cases:
        with pytest.raises(SignatureError, match=reason):
            signer.verify(key, exp, sig, now=now)
    with pytest.raises(SignatureError):
        Signer(b"another-secret-another-secret-xx").verify("a/b.txt", str(expires), signature)
    url = store.signed_url("a/b c.txt".replace(" ", "_"), 30)
    assert url.startswith("http://api.test/v1/files/a/b_c.txt?expires=")


def test_generated_secret_is_private_stable_and_shared(tmp_path: Path) -> None:
    path = tmp_path / "storage" / "signing.key"
    results: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: results.append(load_or_create_secret(path)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and len(results[0]) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["signing.key"]

    settings = Settings(data_dir=tmp_path)
    a, b = make_signer(settings), make_signer(settings)
    assert a.signature("k", 1) == b.signature("k", 1)
    configured = Settings(data_dir=tmp_path, storage={"signing_secret": "s" * 32})
    assert make_signer(configured).signature("k", 1) != a.signature("k", 1)
    with pytest.raises(ValueError):
        Settings(storage={"signing_secret": "short"})
    assert isinstance(make_storage(settings), LocalStorage)


def test_start_up_removes_stale_temp_files(store: LocalStorage) -> None:
    stale, fresh = store.tmp / "stale", store.tmp / "fresh"
    stale.write_bytes(b"half a file")
    fresh.write_bytes(b"being written")
    os.utime(stale, (1, 1))
    store.check()
    assert sorted(p.name for p in store.tmp.iterdir()) == ["fresh"]
