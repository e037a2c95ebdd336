"""The CPU image built and run as docs/deployment/docker.md says, end to end, from the host.

    python -m bench.docker [--base-image IMAGE] [--torch-index URL | --find-links URL |
                            --torch-wheels DIR] [--pip-index URL] [--trusted-host HOST]
                           [--ca FILE] [--valkey | --redis-image IMAGE] [--docker PATH]
                           [--compose CMD] [--tag mmq:cpu] [--cached]
                           [--json bench/results/docker.json]

1. builds `docker/Dockerfile.cpu` (BuildKit) from a snapshot of this checkout (the files
   git tracks or would track), without the build cache unless `--cached`: the full build;
2. appends a comment line to `mmq/__init__.py` in the snapshot and builds again (the
   rebuild after a one-line code change: only the code layer and the project step run),
   then builds the unchanged snapshot once more (every layer cached), so that the tag is
   this checkout's image; the image size;
3. `docker run -p PORT:8000 -e MMQ_API__PUBLIC_URL=... IMAGE` (`mmq up`, everything in
   one container): /readyz, a key made with `docker exec ... mmq keys create`, a noop job
   and a TTS job through the API, the TTS output downloaded from its URL (a WAV);
4. `docker/compose.cpu.yaml` (redis, api, reaper, scheduler, a CPU worker) as project `mmq-bench`:
   the same checks, with the key made by `compose exec api mmq keys create`, and every
   URL checked to be at the public URL;
5. takes everything down (`compose down -v`, the container and its volume) whatever
   happened, prints a table of the steps with their times and writes JSON.

Options are what a host without the usual registries needs: `--base-image` (a local
base with python3 and python3-venv instead of python:3.12-slim), `--torch-wheels DIR`
(a folder of torch wheels served to the build over HTTP on the host's loopback, as
pip's find-links, with `--network host`; the port is fixed, `--wheels-port`, so the
build cache holds across runs), `--ca FILE` (the `ca` build secret), `--valkey` (Redis
from the mmq image, `docker/compose.valkey.yaml`, where redis:7.4 cannot be pulled).

Exit status: 0 when every check passed, 1 when one failed, 2 when it cannot run here
(no Docker daemon answers, no BuildKit, no Compose).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from bench.docker_tools import (
    REPO,
    CannotRun,
    Failed,
    check_buildkit,
    docker_server,
    find_compose,
    run,
    serve_folder,
    snapshot,
    steps_run,
)
from common.procs import free_port

DOCKER_DIR = REPO / "docker"
PROJECT = "mmq-bench"
CONTAINER = "mmq-bench-run"
VOLUME = "mmq-bench-data"
READY_TIMEOUT_S = 300.0
BUILD_TIMEOUT_S = 3600.0
JOB_WAIT_S = 60
CHANGED_FILE = "mmq/__init__.py"
CHANGE = "# bench.docker: a one-line change, to time the rebuild\n"


@dataclass
class Step:
    name: str
    seconds: float | None
    detail: str = ""
    ok: bool = True


@dataclass
class Report:
    steps: list[Step] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, seconds: float | None, detail: str = "", ok: bool = True) -> Step:
        step = Step(name, None if seconds is None else round(seconds, 2), detail, ok)
        self.steps.append(step)
        mark = "" if ok else "  FAILED"
        shown = "" if seconds is None else f" {seconds:.2f} s"
        print(f"  {name}:{shown} {detail}{mark}", flush=True)
        return step

    def table(self) -> str:
        width = max(len(s.name) for s in self.steps)
        lines = [f"{'step':<{width}}  {'seconds':>8}  detail"]
        for s in self.steps:
            seconds = "-" if s.seconds is None else f"{s.seconds:.2f}"
            detail = s.detail if s.ok else f"FAILED: {s.detail}"
            lines.append(f"{s.name:<{width}}  {seconds:>8}  {detail}")
        return "\n".join(lines)


@dataclass
class Options:
    docker: str
    compose: list[str]
    tag: str
    build_args: dict[str, str]
    secret: str | None
    network_host: bool
    compose_files: list[str]
    compose_env: dict[str, str]


def image_id(opts: Options) -> str:
    """The id of the image `opts.tag` names now."""
    return run([opts.docker, "image", "inspect", "-f", "{{.Id}}", opts.tag]).stdout.strip()


def build(opts: Options, context: Path, log: Path, no_cache: bool) -> tuple[float, str]:
    """Build the CPU image from `context`: (seconds, "N of M steps cached")."""
    argv = [opts.docker, "build", "--progress=plain", "-f", "docker/Dockerfile.cpu"]
    argv += ["-t", opts.tag]
    for name, value in opts.build_args.items():
        argv += ["--build-arg", f"{name}={value}"]
    if opts.secret:
        argv += ["--secret", f"id=ca,src={opts.secret}"]
    if opts.network_host:
        argv += ["--network", "host"]
    if no_cache:
        argv.append("--no-cache")
    start = time.perf_counter()
    done = run(
        [*argv, str(context)],
        env={"DOCKER_BUILDKIT": "1"},
        timeout=BUILD_TIMEOUT_S,
        log=log,
    )
    return time.perf_counter() - start, steps_run(done.stdout + done.stderr)


def wait_ready(base: str, alive: Any, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Seconds until GET /readyz answers 200; `alive()` says why it cannot (or None)."""
    start = time.perf_counter()
    last = "no answer"
    while time.perf_counter() - start < timeout_s:
        try:
            answer = httpx.get(f"{base}/readyz", timeout=3)
            if answer.status_code == 200:
                return time.perf_counter() - start
            last = f"{answer.status_code} {answer.text[:200]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}"
        if why := alive():
            raise Failed(why)
        time.sleep(1)
    raise Failed(f"{base}/readyz did not answer 200 within {timeout_s:.0f} s: {last}")


def submit(
    client: httpx.Client, kind: str, payload: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    """A job through the API, waited for: (seconds, the ended job); Failed unless it
    succeeded."""
    start = time.perf_counter()
    answer = client.post(
        "/v1/jobs",
        json={"kind": kind, "input": payload},
        headers={"Prefer": f"wait={JOB_WAIT_S}"},
    )
    if answer.status_code not in (200, 202):
        raise Failed(f"{kind} job: {answer.status_code} {answer.text[:300]}")
    job: dict[str, Any] = answer.json()
    deadline = time.monotonic() + 3 * JOB_WAIT_S
    while job["status"] in ("queued", "running") and time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job['id']}", headers={"Prefer": f"wait={JOB_WAIT_S}"}).json()
    seconds = time.perf_counter() - start
    if job["status"] != "succeeded":
        raise Failed(f"{kind} job {job['id']} ended {job['status']}: {job.get('error')}")
    return seconds, job


def check_jobs(report: Report, prefix: str, base: str, key: str) -> None:
    """A noop job, a TTS job, and the TTS output downloaded from its URL (a WAV at the
    public URL `base`, no key: the signed URL alone)."""
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=auth, timeout=JOB_WAIT_S + 30) as client:
        seconds, job = submit(client, "noop", {"payload": "hello"})
        if job["output"] != {"payload": "hello"}:
            raise Failed(f"noop job output {job['output']!r}")
        report.add(f"{prefix}: noop job", seconds, "succeeded, payload echoed")
        text = "The image runs as the docs say. Every URL is at the public address."
        seconds, job = submit(client, "tts", {"text": text})
        audio = job["output"]["audio"]
        report.add(
            f"{prefix}: tts job",
            seconds,
            f"{job['output']['duration_s']:.1f} s of audio, {job['output']['engine']}",
        )
        urls = [audio["url"], *job["urls"].values()]
        wrong = [u for u in urls if not u.startswith((base + "/", base.replace("http", "ws", 1)))]
        if wrong:
            raise Failed(f"URLs not at the public URL {base}: {wrong}")
        start = time.perf_counter()
        answer = httpx.get(audio["url"], timeout=30)  # no key: the signature is enough
        data = answer.content
        if answer.status_code != 200 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
            raise Failed(f"output URL: {answer.status_code}, {data[:12]!r}")
        if len(data) != audio["bytes"]:
            raise Failed(f"output URL: {len(data)} bytes, the job says {audio['bytes']}")
        report.add(
            f"{prefix}: output URL download",
            time.perf_counter() - start,
            f"WAV, {len(data):,} bytes, from {audio['url'].split('?')[0]}",
        )


def container_state(docker: str, name: str) -> str | None:
    """Why container `name` cannot answer (it exited), or None while it runs."""
    state = run([docker, "inspect", "-f", "{{.State.Status}}", name], check=False).stdout
    if state.strip() == "running":
        return None
    logs = run([docker, "logs", "--tail", "30", name], check=False)
    return f"container {name} is {state.strip()}:\n{logs.stdout}{logs.stderr}"


def prove_docker_run(opts: Options, report: Report) -> None:
    """The docs' `docker run`: everything in one container, `mmq up`."""
    port = free_port()
    base = f"http://localhost:{port}"
    run([opts.docker, "rm", "-f", CONTAINER], check=False)
    run([opts.docker, "volume", "rm", "-f", VOLUME], check=False)
    try:
        run(
            [
                *(opts.docker, "run", "-d", "--name", CONTAINER, "-p", f"{port}:8000"),
                *("-v", f"{VOLUME}:/data", "-e", f"MMQ_API__PUBLIC_URL={base}", opts.tag),
            ]
        )
        seconds = wait_ready(base, lambda: container_state(opts.docker, CONTAINER))
        report.add("docker run: /readyz", seconds, f"{base} (mmq up in one container)")
        start = time.perf_counter()
        key = run([opts.docker, "exec", CONTAINER, "mmq", "keys", "create", "bench"])
        report.add(
            "docker run: key (docker exec)",
            time.perf_counter() - start,
            "mmq keys create, against mmq up's embedded Redis",
        )
        check_jobs(report, "docker run", base, key.stdout.strip())
    except Failed:
        logs = run([opts.docker, "logs", "--tail", "40", CONTAINER], check=False)
        print(logs.stdout + logs.stderr, file=sys.stderr)
        raise
    finally:
        start = time.perf_counter()
        run([opts.docker, "rm", "-f", CONTAINER], check=False)
        run([opts.docker, "volume", "rm", "-f", VOLUME], check=False)
        report.add("docker run: removed", time.perf_counter() - start, "container and volume")


def prove_compose(opts: Options, report: Report) -> None:
    """The docs' compose deployment: redis, api, reaper, scheduler, a CPU worker."""
    port = free_port()
    base = f"http://localhost:{port}"
    env = {**opts.compose_env, "MMQ_PORT": str(port), "MMQ_PUBLIC_URL": base}
    compose = [*opts.compose, "-p", PROJECT]
    for name in opts.compose_files:
        compose += ["-f", str(DOCKER_DIR / name)]
    files = " + ".join(opts.compose_files)

    def alive() -> str | None:
        ps = run([*compose, "ps"], env=env, check=False)
        if re.search(r"\b(Exit|exited|Restarting|restarting)\b", ps.stdout):
            return f"a service is down:\n{ps.stdout}"
        return None

    try:
        start = time.perf_counter()
        run([*compose, "up", "-d", "--no-build"], env=env, timeout=300)
        up_s = time.perf_counter() - start
        services = run([*compose, "ps", "--services"], env=env).stdout.split()
        report.add("compose up -d", up_s, f"{files}: {', '.join(sorted(services))}")
        ready_s = wait_ready(base, alive)
        report.add("compose: /readyz", up_s + ready_s, f"{base}, from `up`")
        start = time.perf_counter()
        key = run([*compose, "exec", "-T", "api", "mmq", "keys", "create", "bench"], env=env)
        report.add(
            "compose: key (compose exec)", time.perf_counter() - start, "mmq keys create in api"
        )
        check_jobs(report, "compose", base, key.stdout.strip())
    except Failed:
        logs = run([*compose, "logs", "--tail", "30"], env=env, check=False)
        print(logs.stdout + logs.stderr, file=sys.stderr)
        raise
    finally:
        start = time.perf_counter()
        down = run([*compose, "down", "-v"], env=env, check=False, timeout=300)
        report.add(
            "compose down -v",
            time.perf_counter() - start,
            "containers, network and volumes removed",
            ok=down.returncode == 0,
        )


def build_options(args: argparse.Namespace) -> tuple[Options, dict[str, str]]:
    """The options, and the build args shown in the report."""
    build_args: dict[str, str] = {}
    if args.base_image:
        build_args["BASE_IMAGE"] = args.base_image
    if args.torch_index is not None:
        build_args["TORCH_INDEX"] = args.torch_index
    if args.pip_index:
        build_args["PIP_INDEX_URL"] = args.pip_index
    if args.trusted_host:
        build_args["PIP_TRUSTED_HOST"] = args.trusted_host
    if args.find_links:
        build_args["PIP_FIND_LINKS"] = args.find_links
    if (args.find_links or args.torch_wheels) and args.torch_index is None:
        build_args["TORCH_INDEX"] = ""  # pip's own index, with the find-links
    if args.ca and not Path(args.ca).is_file():
        raise Failed(f"--ca {args.ca}: no such file")
    compose_files = ["compose.cpu.yaml"] + (["compose.valkey.yaml"] if args.valkey else [])
    compose_env = {"MMQ_IMAGE": args.tag}
    if args.redis_image:
        compose_env["MMQ_REDIS_IMAGE"] = args.redis_image
    local = bool(args.torch_wheels) or bool(
        args.find_links and re.match(r"https?://(127\.0\.0\.1|localhost)[:/]", args.find_links)
    )
    opts = Options(
        docker=args.docker,
        compose=[],
        tag=args.tag,
        build_args=build_args,
        secret=str(Path(args.ca).resolve()) if args.ca else None,
        network_host=local,
        compose_files=compose_files,
        compose_env=compose_env,
    )
    return opts, build_args


def prove(args: argparse.Namespace, report: Report) -> None:
    opts, build_args = build_options(args)
    start = time.perf_counter()
    server = docker_server(opts.docker)
    buildkit = check_buildkit(opts.docker)
    opts.compose = find_compose(opts.docker, args.compose)
    compose_version = run([*opts.compose, "version", "--short"], check=False).stdout.strip()
    report.add(
        "docker daemon",
        time.perf_counter() - start,
        f"server {server}, BuildKit by {buildkit}, compose {compose_version or '?'} "
        f"({shlex.join(opts.compose)})",
    )
    report.meta.update(
        docker_server=server,
        buildkit=buildkit,
        compose=shlex.join(opts.compose),
        compose_version=compose_version,
        compose_files=opts.compose_files,
        tag=opts.tag,
        build_args=build_args,
        ca_secret=opts.secret,
        torch_wheels=args.torch_wheels,
    )
    log = Path(args.json).with_suffix(".build.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    with contextlib.ExitStack() as stack:
        if args.torch_wheels:
            url = stack.enter_context(serve_folder(Path(args.torch_wheels), args.wheels_port))
            opts.build_args["PIP_FIND_LINKS"] = url
            report.meta["build_args"]["PIP_FIND_LINKS"] = url
        context = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-docker-")))
        start = time.perf_counter()
        files = snapshot(context)
        report.add("build context", time.perf_counter() - start, f"{files} files of this checkout")
        seconds, ran = build(opts, context, log, no_cache=not args.cached)
        how = "cached layers allowed" if args.cached else "--no-cache"
        base = build_args.get("BASE_IMAGE", "python:3.12-slim")
        report.add("build", seconds, f"{opts.tag} from {base}, {how}: {ran}")
        changed = context / CHANGED_FILE
        original = changed.read_text()
        changed.write_text(original + CHANGE)
        seconds, ran = build(opts, context, log, no_cache=False)
        report.add("rebuild after a one-line code change", seconds, f"{CHANGED_FILE}: {ran}")
        one_line = image_id(opts)
        changed.write_text(original)
        seconds, ran = build(opts, context, log, no_cache=False)
        report.add("build again, unchanged", seconds, ran)
        if image_id(opts) != one_line:  # the tag moved back: the changed build is left untagged
            run([opts.docker, "image", "rm", one_line])
    size = int(run([opts.docker, "image", "inspect", "-f", "{{.Size}}", opts.tag]).stdout)
    report.meta["image_bytes"] = size
    report.add("image size", None, f"{size / 1e9:.2f} GB ({size:,} bytes)")
    prove_docker_run(opts, report)
    prove_compose(opts, report)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.docker",
        description="Build the CPU image and run it (docker run, then compose) end to end.",
    )
    parser.add_argument("--base-image", help="BASE_IMAGE (default: the Dockerfile's)")
    parser.add_argument("--torch-index", help="TORCH_INDEX ('' : pip's own index)")
    parser.add_argument("--find-links", help="PIP_FIND_LINKS: a page of wheels (e.g. torch)")
    parser.add_argument(
        "--torch-wheels", help="a folder of torch wheels, served to the build as find-links"
    )
    parser.add_argument("--wheels-port", type=int, default=18765, help="its loopback port")
    parser.add_argument("--pip-index", help="PIP_INDEX_URL: a PyPI mirror")
    parser.add_argument("--trusted-host", help="PIP_TRUSTED_HOST")
    parser.add_argument("--ca", help="a CA bundle, given to the build as the `ca` secret")
    parser.add_argument(
        "--valkey", action="store_true", help="Redis from the mmq image (compose.valkey.yaml)"
    )
    parser.add_argument("--redis-image", help="MMQ_REDIS_IMAGE (default redis:7.4)")
    parser.add_argument("--docker", default="docker", help="the docker client (default: docker)")
    parser.add_argument("--compose", help="the compose command (default: found)")
    parser.add_argument("--tag", default="mmq:cpu")
    parser.add_argument(
        "--cached", action="store_true", help="let the first build use the build cache"
    )
    parser.add_argument("--json", default=str(REPO / "bench" / "results" / "docker.json"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    report = Report(meta={"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    commit = run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=False)
    report.meta["commit"] = commit.stdout.strip()
    changes = run(["git", "-C", str(REPO), "status", "--porcelain"], check=False).stdout
    report.meta["uncommitted_changes"] = bool(changes.strip())  # the snapshot has them

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # the finally blocks take everything down

    signal.signal(signal.SIGTERM, stop)
    status = 0
    start = time.perf_counter()
    print(f"bench.docker: {REPO} at {report.meta['commit']}", flush=True)
    try:
        prove(args, report)
    except CannotRun as exc:
        print(f"bench.docker cannot run here: {exc}", file=sys.stderr)
        return 2
    except (Failed, subprocess.TimeoutExpired, httpx.HTTPError, KeyError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [repr(exc)]
        why = lines[0][:160] + ("" if len(lines) == 1 else f" ... {lines[-1][:160]}")
        report.add("failed", None, why, ok=False)
        print(f"bench.docker: FAILED: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        report.add("interrupted", None, "", ok=False)
        status = 1
    report.add("total", time.perf_counter() - start)
    report.meta["ok"] = status == 0
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({**report.meta, "steps": [asdict(s) for s in report.steps]}, indent=2) + "\n"
    )
    print()
    print(report.table())
    print(f"\n{'ok' if status == 0 else 'FAILED'}; JSON in {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
