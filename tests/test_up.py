"""`mmq up` on a bare machine: embedded Redis, API, reaper, a worker; Ctrl-C stops all."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from common.procs import free_port
from host.redis_server import RedisServer, running_url
from tuning.deployment import REPO, cmdline, wait_until


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_mmq_up_serves_jobs_and_ctrl_c_leaves_no_orphan(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MMQ_")},
        "MMQ_API__PORT": str(port),
        "MMQ_EMBEDDED_REDIS_PORT": str(free_port()),
        "MMQ_DATA_DIR": str(tmp_path / "data"),
        "PYTHONPATH": str(REPO),
        "XDG_STATE_HOME": str(tmp_path / "state"),  # the index of running `mmq up`s
    }
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "-m", "mmq.cli", "up", "--config", str(REPO / "mmq.toml")],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(ready, timeout_s=180)  # a TTS, an ASR and an LLM engine load on 2 cores
        except TimeoutError:
            raise TimeoutError((tmp_path / "up.log").read_text()[-6000:]) from None
        r = httpx.post(
            f"{base}/v1/jobs",
            json={"kind": "noop", "input": {"payload": "hi"}},
            headers={"Prefer": "wait=10"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["output"] == {"payload": "hi"}
        # A second `mmq up` on the same data dir is refused at once, naming the first, and
        # leaves it as it was (its Redis URL file too: `mmq keys` below finds it).
        second = subprocess.run(
            [sys.executable, "-m", "mmq.cli", "up", "--config", str(REPO / "mmq.toml")],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"is in use by another `mmq up` (pid {up.pid}, Redis redis://" in second.stderr
        assert f"API {base}" in second.stderr
        # Other commands with the same data dir find the embedded server by themselves.
        keys = [sys.executable, "-m", "mmq.cli", "keys"]
        made = subprocess.run(
            [*keys, "create", "alice"], env=env, cwd=tmp_path, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert made.returncode == 0 and made.stdout.startswith("mmq_"), made.stderr
        r = httpx.get(f"{base}/v1/jobs", headers={"Authorization": f"Bearer {made.stdout.strip()}"})
        assert r.status_code == 200 and r.json()["data"] == []  # alice's jobs, not local's
        gone = subprocess.run(
            [*keys, "revoke", "alice"], env=env, cwd=tmp_path, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert gone.stdout.strip() == "revoked 1 key(s)", gone.stderr
        # So do they from any directory, with no data dir set: this user's one `mmq up`.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        anywhere = {k: v for k, v in env.items() if k != "MMQ_DATA_DIR"}
        bob = subprocess.run(
            [*keys, "create", "bob"], env=anywhere, cwd=elsewhere, capture_output=True,
            text=True, timeout=60, check=False,
        )  # fmt: skip
        assert bob.returncode == 0 and bob.stdout.startswith("mmq_"), bob.stderr
        assert f"using the `mmq up` with data dir {(tmp_path / 'data').resolve()}" in bob.stderr
        printed = (tmp_path / "up.log").read_text()
        wait_until(lambda: f"ready  {base}" in (tmp_path / "up.log").read_text(), timeout_s=10)
        printed = (tmp_path / "up.log").read_text()
        for line in ("keys   ", f"data   {tmp_path / 'data'}", "logs   here", "durability fsync"):
            assert line in printed, printed
        assert "celery@" not in printed and "[tasks]" not in printed  # no Celery banners
        assert "/readyz" not in printed  # the wait for ready is not logged poll by poll
        # The keys line names an `mmq` that runs from a shell as it is (PATH or a path).
        shown = re.search(r"`(\S+) keys create NAME`", printed)
        assert shown is not None, printed
        assert shutil.which(shown[1], path=env.get("PATH")) or Path(shown[1]).is_file()
        # The embedded server dies: mmq up starts it again on its data dir, and every
        # process reconnects by itself.
        (server,) = [p for p in _children(up.pid) if b"-server" in cmdline(p)]
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: "embedded Redis started again" in (tmp_path / "up.log").read_text())
        wait_until(ready, timeout_s=30)
        r = httpx.post(
            f"{base}/v1/jobs",
            json={"kind": "noop", "input": {"payload": "again"}},
            headers={"Prefer": "wait=10"},
        )
        assert r.status_code == 200 and r.json()["output"] == {"payload": "again"}, r.text
        children = _children(up.pid)
        assert len(children) >= 4  # redis, api, reaper, one worker
        up.send_signal(signal.SIGINT)
        assert up.wait(30) == 0
        wait_until(lambda: not any(_alive(pid) for pid in children), timeout_s=10)
        text = (tmp_path / "up.log").read_text()
        assert f"api    {base}" in text and "stopped" in text
        assert (tmp_path / "data" / "redis" / "appendonlydir").is_dir()
        assert not list((tmp_path / "state" / "mmq" / "up").iterdir())  # no longer listed
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()


def test_a_server_that_finds_its_port_taken_says_so_and_leaves_the_first_alone(
    tmp_path: Path,
) -> None:
    """Two embedded servers on one data dir and port: the second sees that the server that
    answers is not its own, and its stop leaves the first's URL file."""
    port = free_port()
    first = RedisServer(tmp_path, port=port, persist=False).start()
    try:
        second = RedisServer(tmp_path, port=port, persist=False)
        with pytest.raises(RuntimeError, match=f"port {port} is taken by another server"):
            second.start()
        second.stop()
        assert running_url(tmp_path) == first.url
    finally:
        first.stop()
    assert running_url(tmp_path) is None


@pytest.mark.parametrize(
    ("taken", "setting"),
    [("MMQ_API__PORT", "MMQ_API__PORT (api.port)"),
     ("MMQ_EMBEDDED_REDIS_PORT", "MMQ_EMBEDDED_REDIS_PORT (embedded_redis_port)")],
)  # fmt: skip
def test_mmq_up_on_a_port_another_server_holds_says_so_in_two_lines(
    tmp_path: Path, taken: str, setting: str
) -> None:
    ports = {"MMQ_API__PORT": free_port(), "MMQ_EMBEDDED_REDIS_PORT": free_port()}
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MMQ_")},
        **{name: str(port) for name, port in ports.items()},
        "MMQ_DATA_DIR": str(tmp_path / "data"),
        "PYTHONPATH": str(REPO),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    with socket.socket() as holder:  # another server
        holder.bind(("127.0.0.1", ports[taken]))
        holder.listen()
        done = subprocess.run(
            [sys.executable, "-m", "mmq.cli", "up", "--config", str(REPO / "mmq.toml")],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"port {ports[taken]} (the {'API' if 'API' in taken else 'embedded Redis'}'s) is in use "
        "by another server: mmq up starts nothing",
        f"stop that server, or set {setting}",
    ]
