"""Resolving job input references (stored keys, http(s) URLs) as a worker does."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest

from harness.storage_servers import MIB, http_server, pattern_sha256
from jobs.errors import InputError, TooLarge
from jobs.settings import Settings
from storage.factory import make_storage
from storage.fetch import InputFetcher
from storage.local import LocalStorage


def _fetcher(tmp_path: Path, **net: object) -> InputFetcher:
    settings = Settings(
        data_dir=tmp_path, storage={"max_upload_bytes": 2 * MIB}, net={"fetch_timeout_s": 5, **net}
    )
    return InputFetcher(settings, make_storage(settings))


def _sha(fetcher: InputFetcher, ref: str, owner: str = "alice") -> str:
    with fetcher.open(ref, owner=owner, field="input.audio") as stream:
        return hashlib.sha256(stream.read()).hexdigest()


def test_stored_keys_resolve_for_their_owner_only(tmp_path: Path) -> None:
    fetcher = _fetcher(tmp_path)
    assert isinstance(fetcher.storage, LocalStorage)
    fetcher.storage.put("alice/uploads/u1/a.wav", b"RIFF....", "audio/wav")
    with fetcher.local_path("alice/uploads/u1/a.wav", owner="alice", field="input.audio") as path:
        assert path == fetcher.storage.path_of("alice/uploads/u1/a.wav")
        assert path.read_bytes() == b"RIFF...."
    for ref, owner in [
        ("alice/uploads/u1/a.wav", "bob"),
        ("alice/uploads/u1/missing.wav", "alice"),
        ("alice/../bob/x.wav", "alice"),
        ("s3://bucket/alice/uploads/u1/a.wav", "alice"),
        ("ftp://example.com/a.wav", "alice"),
    ]:
        with pytest.raises(InputError) as caught:
            fetcher.open(ref, owner=owner, field="input.audio")
        assert caught.value.field == "input.audio"
        with pytest.raises(InputError):  # noqa: SIM117 - the error comes from entering
            with fetcher.local_path(ref, owner=owner, field="input.audio"):
                pass


def test_urls_download_streaming_under_the_size_limit(tmp_path: Path) -> None:
    fetcher = _fetcher(tmp_path, allowed_networks=["127.0.0.1/32"])
    with http_server() as base:
        assert _sha(fetcher, f"{base}/bytes/{MIB + 7}") == pattern_sha256(MIB + 7)
        assert _sha(fetcher, f"{base}/chunked/{MIB}") == pattern_sha256(MIB)
        with fetcher.local_path(f"{base}/bytes/1000?x=1.wav", owner="a", field="f") as path:
            assert path.stat().st_size == 1000 and path.exists()
        assert not path.exists()
        for url in (f"{base}/bytes/{3 * MIB}", f"{base}/chunked/{3 * MIB}"):
            with pytest.raises(TooLarge, match="over the limit"):
                fetcher.open(url, owner="a", field="input.audio")
        with pytest.raises(InputError, match="answered 404"):
            fetcher.open(f"{base}/nothing", owner="a", field="input.audio")


def test_urls_to_private_addresses_are_refused_at_connect_time(tmp_path: Path) -> None:
    with http_server() as base, http_server("127.0.0.2") as other:
        fetcher = _fetcher(tmp_path)
        with pytest.raises(InputError, match="loopback") as caught:
            fetcher.open(f"{base}/bytes/10", owner="a", field="input.audio")
        assert caught.value.field == "input.audio"

        first_only = _fetcher(tmp_path, allowed_networks=["127.0.0.1/32"])
        with pytest.raises(InputError, match=r"127\.0\.0\.2"):
            first_only.open(f"{base}/redirect?to={other}/bytes/10", owner="a", field="f")

        few_hops = _fetcher(tmp_path, allow_private_addresses=True, fetch_max_redirects=1)
        hop = f"{base}/redirect?to={base}/redirect?to={base}/bytes/1"
        with pytest.raises(InputError, match="redirects too many times"):
            few_hops.open(hop, owner="a", field="f")


def test_a_download_has_a_deadline_as_a_whole(tmp_path: Path) -> None:
    """A server that drips a byte every 0.2 s never trips the 5 s read timeout; the 1.5 s
    deadline stops it, as it stops one that sends no headers at all."""
    fetcher = _fetcher(tmp_path, allowed_networks=["127.0.0.1/32"], fetch_deadline_s=1.5)
    with http_server() as base:
        for path in ("/drip/1000?every=0.2", "/silent"):
            started = time.monotonic()
            with pytest.raises(InputError, match=r"within 1\.5 s \(net\.fetch_deadline_s\)"):
                fetcher.open(f"{base}{path}", owner="a", field="input.audio")
            assert time.monotonic() - started < 4.5, path  # not the 5 s read timeout
        assert _sha(fetcher, f"{base}/drip/3?every=0.1") == hashlib.sha256(b"xxx").hexdigest()


def test_a_cancel_stops_a_download_that_waits_for_bytes(tmp_path: Path) -> None:
    """A read that waits (the server sends nothing for 30 s) ends at once on cancel."""
    fetcher = _fetcher(tmp_path, allowed_networks=["127.0.0.1/32"], fetch_deadline_s=60)
    cancel = threading.Event()
    with http_server() as base:
        for path in ("/drip/100?every=30", "/silent"):
            cancel.clear()
            timer = threading.Timer(0.5, cancel.set)
            timer.start()
            started = time.monotonic()
            with pytest.raises(InputError, match="the job was canceled") as caught:
                fetcher.open(f"{base}{path}", owner="a", field="input.audio", cancel=cancel)
            assert caught.value.field == "input.audio"
            assert time.monotonic() - started < 3, path  # not the 5 s read timeout
        # Canceled before its connection opened: that connection is stopped as it opens.
        cancel.set()
        started = time.monotonic()
        with pytest.raises(InputError, match="the job was canceled"):
            fetcher.open(f"{base}/silent", owner="a", field="input.audio", cancel=cancel)
        assert time.monotonic() - started < 3
