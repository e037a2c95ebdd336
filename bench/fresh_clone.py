"""From a fresh clone to `make run` answering /readyz, per revision, in one run.

    python -m bench.fresh_clone [--rev REV ...] [--port 8000] [--keep-caches]
                                [--json bench/results/fresh-clone.json]

For each revision (default: HEAD) it clones this checkout into a temporary folder, checks
the revision out, runs `make install` (timed), then `make run` until `GET /readyz`
answers 200 (timed), stops everything it started and removes the folder. pip's and uv's
caches are off unless `--keep-caches`, as on a fresh machine. Revisions run one after the
other in the same invocation, so their ratio is one run's (this machine is shared).

Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 300.0
INSTALL_TIMEOUT_S = 1800.0


@dataclass
class CloneRun:
    rev: str
    commit: str
    install_s: float
    """`make install` in the fresh clone, from nothing."""
    ready_s: float
    """`make run` started until /readyz answered 200 (-1: never within the limit)."""
    total_s: float
    ok: bool
    error: str = ""


def _env(keep_caches: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    if not keep_caches:
        env["PIP_NO_CACHE_DIR"] = "1"
        env["UV_NO_CACHE"] = "1"
    return env


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            return -1.0
        if _ready(url):
            return time.monotonic() - start
        time.sleep(0.25)
    return -1.0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def measure(rev: str, port: int, keep_caches: bool) -> CloneRun:
    env = _env(keep_caches)
    env["MMQ_API__PORT"] = str(port)
    with tempfile.TemporaryDirectory(prefix="mmq-clone-") as tmp:
        work = Path(tmp) / "mmq"
        subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
        subprocess.run(["git", "-C", str(work), "checkout", "-q", rev], check=True)
        commit = subprocess.run(
            ["git", "-C", str(work), "rev-parse", "--short", "HEAD"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        start = time.monotonic()
        install = subprocess.run(
            ["make", "install"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        install_s = time.monotonic() - start
        if install.returncode != 0:
            return CloneRun(rev, commit, install_s, -1, install_s, False, install.stderr[-2000:])
        log = (Path(tmp) / "run.log").open("wb")
        proc = subprocess.Popen(
            ["make", "run"],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            ready_s = _wait_ready(f"http://127.0.0.1:{port}/readyz", proc, READY_TIMEOUT_S)
        finally:
            _stop(proc)
            log.close()
        error = "" if ready_s >= 0 else (Path(tmp) / "run.log").read_text()[-2000:]
        return CloneRun(
            rev, commit, install_s, ready_s, install_s + max(ready_s, 0), ready_s >= 0, error
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", action="append", help="revision to measure (repeatable)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--keep-caches", action="store_true")
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/fresh-clone.json")
    args = parser.parse_args(argv)
    if shutil.which("make") is None:
        print("make is not installed", file=sys.stderr)
        return 2
    runs = []
    for rev in args.rev or ["HEAD"]:
        print(f"{rev}: cloning, installing, starting ...", flush=True)
        runs.append(measure(rev, args.port, args.keep_caches))
        print(f"  {runs[-1]}", flush=True)
    print(f"\n{'rev':<14}{'commit':<10}{'install s':>11}{'ready s':>9}{'total s':>9}")
    for run in runs:
        print(
            f"{run.rev:<14}{run.commit:<10}{run.install_s:>11.1f}{run.ready_s:>9.1f}"
            f"{run.total_s:>9.1f}{'' if run.ok else '  FAILED'}"
        )
    if len(runs) > 1 and runs[0].ok and runs[-1].ok:
        print(f"\ntotal, last / first: {runs[-1].total_s / runs[0].total_s:.2f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps([asdict(r) for r in runs], indent=2))
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
