"""A soak across hosts: mixed jobs while links are cut and workers killed, at random.

    python -m bench.soak [--hosts 3] [--minutes 10] [--rate 2] [--fault-every-s 40]
                         [--seed 1] [--out bench/results/soak.json]

Needs root (Linux network namespaces, harness/netns.py). One "host" runs Redis
(valkey, `appendonly yes`, `appendfsync always`, `redis.durability = fsync`), one the API
and the reaper, and `--hosts` more each run `mmq workers --host-name wN` (supervised:
noop, tts and asr workers from the repository's mmq.toml, on the CPU). The client is the
root namespace: it submits noop, tts and asr jobs at `--rate` per second (open loop,
`Prefer: wait`), and every `--fault-every-s` (seeded) either cuts a worker host's link
for 8-15 s or SIGKILLs one of its worker processes (its supervisor starts it again).

It prints, and writes as JSON: accepted, succeeded, failed (with reasons), lost (no end),
run again (a job whose run a fault cut off, started again: delivery is at least once),
run twice (a job started again while no fault had cut its first run off: must be 0),
ended twice (must be 0), end-to-end p50/p99 before the first fault, during faults (from a
fault until its host serves again) and after, and per kind; and per fault the time to
recover: from the kill, or from the link's return, until every worker of its host beats
again (a killed worker is started again by its supervisor and loads its model first).
Exit status 1 if anything was lost, run twice or ended twice.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import redis
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms, run_meta
from harness.faults import settle
from harness.netns import NetHost, Network, pids_inside, unavailable
from host.redis_server import server_binary
from jobs import keys
from jobstore.api_keys import create_key
from jobstore.codec import time_seconds
from tuning.deployment import REPO, Deployment, answers, cmdline, serving, wait_until

console = Console(width=140)
REDIS_PORT = 6379
API_PORT = 8000
PIPELINES = ("noop", "tts", "asr")
"""The workers each worker host runs (mmq.toml's enabled pipelines)."""
ENV = {
    "MMQ_LEASE__TTL_S": "5",
    "MMQ_LEASE__HEARTBEAT_S": "1",
    "MMQ_REDIS__DURABILITY": "fsync",
    "MMQ_STORAGE__LOCAL_SHARED": "true",  # the namespaces share this machine's disk
    "MMQ_AUTH__REQUIRED": "true",
    "HF_HUB_OFFLINE": "1",
}


@dataclass
class Shot:
    kind: str
    sent: float
    e2e_s: float | None = None
    status: str = ""
    job_id: str = ""
    error: str = ""


@dataclass
class Fault:
    what: str
    host: str
    at: float
    at_ms: int = 0
    """When, on Redis's clock (stream ids are on it)."""
    pid: int | None = None
    """The worker process killed (None: the whole host was cut off)."""
    cut_s: float = 0.0
    """How long the link was down."""
    until: float | None = None
    """When its host served again (all its workers live)."""

    def cut_off(self, worker: str, started_ms: int, next_ms: int) -> bool:
        """Whether this fault explains why `worker`'s run, started at `started_ms`, was
        followed by another run at `next_ms`."""
        if f"@{self.host}." not in worker or not started_ms - 1000 <= self.at_ms <= next_ms:
            return False
        return self.pid is None or worker.endswith(f".{self.pid}")

    @property
    def recover_s(self) -> float | None:
        """From the kill, or from the link's return, until the host served again."""
        return None if self.until is None else self.until - self.at - self.cut_s


@dataclass
class Soak:
    net: Network
    dep: Deployment
    api: NetHost
    hosts: dict[str, NetHost]
    r: redis.Redis
    key: str
    audio_key: str = ""
    shots: list[Shot] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://{self.api.address}:{API_PORT}"

    def now_ms(self) -> int:
        return int(time_seconds(self.r.time()) * 1000)

    def serves(self, host: str, killed: int | None = None) -> bool:
        """Whether all of `host`'s workers are live (none of them the killed process): a
        live worker has beaten within its last two beats."""
        beat_s = float(ENV["MMQ_LEASE__HEARTBEAT_S"])
        names = self.r.zrangebyscore(keys.WORKERS, time_seconds(self.r.time()) - 2 * beat_s, "+inf")
        ours = [str(n) for n in names if f"@{host}." in str(n)]
        fresh = [n for n in ours if killed is None or not n.endswith(f".{killed}")]
        return len(fresh) == len(PIPELINES)


def start(net: Network, tmp: Path, workers: int) -> Soak:
    """Redis, the API and the reaper, and `workers` worker hosts, each on its own host."""
    redis_host, api_host = net.add_host("redis"), net.add_host("api")
    hosts = {f"w{i}": net.add_host(f"w{i}") for i in range(workers)}
    dep = Deployment(f"redis://{redis_host.address}:{REDIS_PORT}/0", tmp, env_overrides=ENV)
    dep.config_path = REPO / "mmq.toml"
    server = dep.launch(
        "redis",
        [server_binary(), "--bind", redis_host.address, "--port", str(REDIS_PORT),
         "--protected-mode", "no", "--save", "", "--appendonly", "yes",
         "--appendfsync", "always", "--dir", str(dep.tmp)],
        wrap=redis_host.wrap(),
    )  # fmt: skip
    r = redis.Redis(host=redis_host.address, port=REDIS_PORT, decode_responses=True)
    wait_until(lambda: answers(r), server, timeout_s=15)
    env = {"MMQ_API__HOST": api_host.address, "MMQ_API__PORT": str(API_PORT)}
    api = dep.spawn("api", "api", wrap=api_host.wrap(), env=env)
    dep.spawn("reaper", "reaper", wrap=api_host.wrap())
    for name, host in hosts.items():
        dep.spawn(f"workers-{name}", "workers", "--host-name", name, wrap=host.wrap())
    soak = Soak(net, dep, api_host, hosts, r, create_key(r, "soak"))
    for name in hosts:
        wait_until(lambda n=name: soak.serves(n), api, timeout_s=180)
    soak.audio_key = _upload_clip(soak)
    return soak


def _upload_clip(soak: Soak) -> str:
    from harness.audio import spoken

    files = {"file": ("clip.wav", spoken(("Hello from the soak.",), "wav"), "audio/wav")}
    headers = {"Authorization": f"Bearer {soak.key}"}
    r = httpx.post(
        f"{soak.base_url}/v1/files", files=files, headers=headers, timeout=60, trust_env=False
    )
    r.raise_for_status()
    return str(r.json()["key"])


def body(soak: Soak, kind: str) -> dict[str, Any]:
    if kind == "tts":
        return {"kind": "tts", "input": {"text": "A short soak sentence.", "format": "pcm"}}
    if kind == "asr":
        return {"kind": "asr", "input": {"audio": soak.audio_key, "language": "en"}}
    return {"kind": "noop", "input": {"payload": "soak"}}


def one(soak: Soak, http: httpx.Client, shot: Shot) -> None:
    try:
        r = http.post("/v1/jobs", json=body(soak, shot.kind), headers={"Prefer": "wait=60"})
    except httpx.HTTPError as exc:
        shot.error = type(exc).__name__
        return
    if r.status_code not in (200, 202):
        shot.error = str(r.status_code)
        return
    job = r.json()
    shot.job_id, shot.status = job["id"], job["status"]
    if r.status_code == 200:
        shot.e2e_s = time.monotonic() - shot.sent


def load(soak: Soak, rate: float, stop: threading.Event, rng: random.Random) -> None:
    headers = {"Authorization": f"Bearer {soak.key}"}
    http = httpx.Client(base_url=soak.base_url, headers=headers, timeout=90, trust_env=False)
    with http, ThreadPoolExecutor(max_workers=32) as pool:
        next_at = time.monotonic()
        while not stop.is_set():
            kind = rng.choices(PIPELINES, weights=(6, 2, 2))[0]
            shot = Shot(kind, time.monotonic())
            soak.shots.append(shot)
            pool.submit(one, soak, http, shot)
            next_at += 1 / rate
            stop.wait(max(0.0, next_at - time.monotonic()))


def fault(soak: Soak, rng: random.Random) -> Fault:
    name = rng.choice(sorted(soak.hosts))
    host = soak.hosts[name]
    if rng.random() < 0.5:
        cut = Fault("cut link", name, time.monotonic(), soak.now_ms())
        soak.net.cut(host)
        cut.cut_s = rng.uniform(8, 15)
        time.sleep(cut.cut_s)
        soak.net.restore(host)
    else:
        cut = Fault("SIGKILL a worker", name, time.monotonic(), soak.now_ms())
        cut.pid = kill_one_worker(host, rng)
    wait_until(lambda: soak.serves(name, cut.pid), timeout_s=120)
    cut.until = time.monotonic()
    return cut


def kill_one_worker(host: NetHost, rng: random.Random) -> int | None:
    """SIGKILL one `mmq worker` process inside `host` (not its supervisor); its pid."""
    pids = pids_inside(host.netns)
    workers = sorted(p for p in pids if b"mmq.cli\x00worker\x00" in cmdline(p))
    if not workers:
        return None
    pid = rng.choice(workers)
    os.kill(pid, signal.SIGKILL)
    return pid


def runs(r: redis.Redis, job_id: str) -> list[tuple[int, str]]:
    """A job's runs: (when its `running` event was written, ms on Redis's clock; worker)."""
    out = []
    for event_id, e in r.xrange(keys.job_events(job_id)):
        data = json.loads(e["data"]) if e["type"] == "status" else {}
        if data.get("status") == "running":
            out.append((int(str(event_id).split("-")[0]), str(data.get("worker", ""))))
    return out


def reruns_explained(soak: Soak, job_id: str) -> bool:
    """Whether every run of the job that another run followed was cut off by a fault
    (its host's link cut, or its worker process killed) between the two starts."""
    started = runs(soak.r, job_id)
    return all(
        any(f.cut_off(worker, at, next_at) for f in soak.faults)
        for (at, worker), (next_at, _) in pairwise(started)
    )


def summarize(soak: Soak, started: float) -> dict[str, Any]:
    ids = [s.job_id for s in soak.shots if s.job_id]
    tally = settle(soak.r, ids, timeout_s=180)
    reasons: Counter[str] = Counter()
    unexplained: list[str] = []
    for job_id in ids:
        job = soak.r.hgetall(keys.job(job_id))
        if job.get("status") == "failed":
            reasons[json.loads(job.get("error") or "{}").get("type", "?")] += 1
        if not reruns_explained(soak, job_id):
            unexplained.append(job_id)
    twice = {
        job_id: {
            "runs": runs(soak.r, job_id),
            "faults_ms": [(f.host, f.pid, f.at_ms) for f in soak.faults],
            "statuses": [
                json.loads(e["data"])
                for _, e in soak.r.xrange(keys.job_events(job_id))
                if e["type"] == "status"
            ],
        }
        for job_id in unexplained[:10]
    }
    first = min((f.at for f in soak.faults), default=float("inf"))

    def phase(shot: Shot) -> str:
        if shot.sent < first:
            return "before"
        if any(f.at <= shot.sent <= (f.until or f.at) for f in soak.faults):
            return "during"
        return "after"

    latency: dict[str, dict[str, float | int]] = {}
    for name in ("before", "during", "after"):
        done = [s.e2e_s for s in soak.shots if s.e2e_s is not None and phase(s) == name]
        latency[name] = {
            "jobs": len(done),
            "p50_ms": percentile_ms(done, 50) if done else float("nan"),
            "p99_ms": percentile_ms(done, 99) if done else float("nan"),
        }
    return {
        "minutes": (time.monotonic() - started) / 60,
        "submitted": len(soak.shots),
        "not_accepted": dict(Counter(s.error for s in soak.shots if s.error)),
        **asdict(tally),
        "rerun_after_fault": tally.run_twice - len(unexplained),
        "run_twice": len(unexplained),
        "run_twice_detail": twice,
        "latency_by_kind": {
            kind: {
                "jobs": len(done),
                "p50_ms": percentile_ms(done, 50) if done else float("nan"),
                "p99_ms": percentile_ms(done, 99) if done else float("nan"),
            }
            for kind in PIPELINES
            for done in [[s.e2e_s for s in soak.shots if s.kind == kind and s.e2e_s is not None]]
        },
        "failed_reasons": dict(reasons),
        "latency": latency,
        "faults": [
            {
                "what": f.what,
                "host": f.host,
                "at_s": f.at - started,
                "cut_s": f.cut_s,
                "recover_s": f.recover_s,
            }
            for f in soak.faults
        ],
    }


def report(result: dict[str, Any]) -> None:
    table = Table(title=f"Soak: {result['minutes']:.1f} min across hosts")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name in ("submitted", "accepted", "succeeded", "failed", "lost"):
        table.add_row(name, str(result[name]))
    table.add_row("run again: its run was cut off by a fault", str(result["rerun_after_fault"]))
    table.add_row("run twice: no fault cut its first run off", str(result["run_twice"]))
    table.add_row("ended twice", str(result["ended_twice"]))
    table.add_row("failed by reason", json.dumps(result["failed_reasons"]) or "-")
    table.add_row("not accepted", json.dumps(result["not_accepted"]) or "-")
    for phase, row in result["latency"].items():
        table.add_row(
            f"e2e {phase} faults (p50 / p99 ms, jobs)",
            f"{row['p50_ms']:.0f} / {row['p99_ms']:.0f}, {row['jobs']}",
        )
    for kind, row in result["latency_by_kind"].items():
        table.add_row(
            f"e2e {kind} (p50 / p99 ms, jobs)",
            f"{row['p50_ms']:.0f} / {row['p99_ms']:.0f}, {row['jobs']}",
        )
    console.print(table)
    faults = Table(title="Faults")
    for column in ("at s", "fault", "host", "link down s", "serving again after s"):
        faults.add_column(column)
    for f in result["faults"]:
        recover = f"{f['recover_s']:.1f}" if f["recover_s"] is not None else "-"
        down = f"{f['cut_s']:.1f}" if f["cut_s"] else "-"
        faults.add_row(f"{f['at_s']:.0f}", f["what"], f["host"], down, recover)
    console.print(faults)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--hosts", type=int, default=3, help="worker hosts")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=2.0, help="jobs submitted per second")
    parser.add_argument("--fault-every-s", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    parser.add_argument("--logs", type=Path, help="copy every process's log here at the end")
    args = parser.parse_args(argv)
    if reason := unavailable():
        console.print(f"bench.soak needs network namespaces: {reason}")
        return 2
    net = Network()
    try:
        with tempfile.TemporaryDirectory(prefix="mmq-soak-") as tmp:
            soak = start(net, Path(tmp), args.hosts)
            try:
                with serving(soak.dep):
                    result = run(soak, args)
            finally:
                if args.logs:
                    args.logs.mkdir(parents=True, exist_ok=True)
                    for log in Path(tmp).glob("*.log"):
                        shutil.copy(log, args.logs / log.name)
    finally:
        net.close()
    report(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": run_meta(), "result": result}, indent=2) + "\n")
    console.print(f"results written to {args.out}")
    return 1 if result["lost"] or result["ended_twice"] or result["run_twice"] else 0


def run(soak: Soak, args: argparse.Namespace) -> dict[str, Any]:
    """Load from the start to the end; a fault at seeded random times (every
    `--fault-every-s` on average), none in the last 30 s so that "after" has jobs."""
    load_rng, fault_rng = random.Random(f"{args.seed}-load"), random.Random(f"{args.seed}-faults")
    started = time.monotonic()
    stop = threading.Event()
    loader = threading.Thread(target=load, args=(soak, args.rate, stop, load_rng), daemon=True)
    loader.start()
    end = started + args.minutes * 60
    try:
        while True:
            pause = fault_rng.uniform(0.5, 1.5) * args.fault_every_s
            if time.monotonic() + pause >= end - 30:
                break
            time.sleep(pause)
            soak.faults.append(fault(soak, fault_rng))
            f = soak.faults[-1]
            console.print(
                f"fault {len(soak.faults)}: {f.what} on {f.host}, serving again after "
                f"{f.recover_s:.1f} s"
            )
        stop.wait(max(0.0, end - time.monotonic()))
    finally:
        stop.set()
        loader.join(120)
    return summarize(soak, started)


if __name__ == "__main__":
    sys.exit(main())
