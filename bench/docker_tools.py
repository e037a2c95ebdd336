"""The Docker host's tools, as `bench.docker` drives them: commands run with their output
kept, the daemon and its BuildKit and Compose found, the build context copied, a folder
served to the build, and which steps a build ran."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class CannotRun(Exception):
    """This host cannot run the proof (exit 2): no daemon, no BuildKit, no Compose."""


class Failed(Exception):
    """A check failed (exit 1)."""


def run(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    check: bool = True,
    log: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`argv`, its output captured (appended to `log` where given)."""
    done = subprocess.run(
        list(argv),
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if log is not None:
        with log.open("a") as out:
            out.write(f"$ {shlex.join(argv)}\n{done.stdout}{done.stderr}\n")
    if check and done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise Failed(f"`{shlex.join(argv)}` exited {done.returncode}:\n{tail}")
    return done


def docker_server(docker: str) -> str:
    """The daemon's version; CannotRun when no daemon answers."""
    if shutil.which(docker) is None:
        raise CannotRun(f"no `{docker}` command: install Docker to run this proof")
    try:
        info = run([docker, "version", "--format", "{{.Server.Version}}"], check=False, timeout=30)
    except subprocess.TimeoutExpired:
        raise CannotRun("no Docker daemon answers (`docker version` timed out)") from None
    version = info.stdout.strip()
    if info.returncode != 0 or not version:
        why = (info.stderr.strip().splitlines() or ["no answer"])[-1]
        raise CannotRun(f"no Docker daemon answers: {why}")
    return version


def check_buildkit(docker: str) -> str:
    """How this client builds with BuildKit; CannotRun where it cannot (the Dockerfiles
    mount the `ca` secret, which needs it)."""
    if run([docker, "buildx", "version"], check=False, timeout=30).returncode == 0:
        return "buildx"
    client = run([docker, "version", "--format", "{{.Client.Version}}"], check=False).stdout
    major = re.match(r"\d+", client.strip())
    if major and int(major.group()) >= 23:
        raise CannotRun(
            f"this docker client ({client.strip()}) builds with BuildKit only through the "
            "buildx plugin, which is missing: install it (docker-buildx-plugin), or pass "
            "--docker with a 20.10 client (DOCKER_BUILDKIT=1 is built in there)"
        )
    return "DOCKER_BUILDKIT=1"


def find_compose(docker: str, given: str | None) -> list[str]:
    """`docker compose` (v2), else `docker-compose` (v1), or `given`."""
    if given:
        return shlex.split(given)
    if run([docker, "compose", "version"], check=False, timeout=30).returncode == 0:
        return [docker, "compose"]
    v1 = shutil.which("docker-compose")
    if v1 is None:
        raise CannotRun("no Docker Compose (`docker compose` or `docker-compose`)")
    return [v1]


@contextlib.contextmanager
def serve_folder(folder: Path, port: int) -> Iterator[str]:
    """`folder` over HTTP on the loopback (a find-links page for pip in the build)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise Failed(f"cannot serve {folder} on 127.0.0.1:{port}: {exc} (--wheels-port)") from exc
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.shutdown()
        server.server_close()


def snapshot(dest: Path) -> int:
    """Copy the files git tracks or would track (not the ignored ones) to `dest`: the
    build context, fixed while others edit the checkout."""
    listed = run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    ).stdout
    count = 0
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.is_file():
            continue  # deleted in the work tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        count += 1
    return count


def steps_run(output: str) -> str:
    """Which of the Dockerfile's steps ran (were not cached), from BuildKit's plain log."""
    titles: dict[str, str] = {}
    for m in re.finditer(r"^#(\d+) \[\s*\d+/\d+\] (.*)$", output, re.M):
        titles[m.group(1)] = m.group(2)
    cached = set(re.findall(r"^#(\d+) CACHED", output, re.M))
    steps = {n: t for n, t in titles.items() if not t.startswith("FROM ")}
    ran = [short(t) for n, t in sorted(steps.items(), key=lambda i: int(i[0])) if n not in cached]
    if len(ran) == len(steps):
        return f"all {len(steps)} steps after FROM ran"
    if not ran:
        return f"all {len(steps)} steps cached"
    return f"ran {', '.join(ran)}; {len(steps) - len(ran)} of {len(steps)} cached"


def short(title: str) -> str:
    """A step's title, short: `install.sh project check`, `COPY . .`."""
    if m := re.search(r"scripts/install\.sh /opt/mmq ([\w ]+)", title):
        return f"install.sh {m.group(1).strip()}"
    return title if len(title) <= 40 else title[:37] + "..."
