"""Test hosts on one machine: Linux network namespaces joined by a bridge.

`Network` (as root) makes a bridge in the root namespace with the first address of a
private /24 (10.77.N.0/24, the first N no address of this machine is in), and per host a
namespace whose `eth0` is one end of a veth pair; the other end is a port of the bridge.
Hosts reach each other and the root namespace (the tests' client) over the bridge, and
nothing else: no route leaves the /24. `lo` is up inside each, so a host's own loopback
works too. A process runs inside with `ip netns exec NAME ...` (`NetHost.wrap`).

`cut(host)` sets the host's bridge port down: the cable pulled, so its packets vanish both
ways and nothing refuses a connection (a peer sees only silence, as on a real partition;
`tc netem` is not available here, so no latency or loss short of that). `restore(host)`
sets it up again; TCP connections that were open carry on.

Clean-up always happens (`close`, also on a failed setup): every process still in one of
the namespaces is killed, the namespaces (with their veth pairs) and the bridge deleted.
Names carry the pid of the test process (`mmqh<pid>`), so a run removes what earlier runs
that died left behind (their pid is gone) and never touches a live run's hosts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

PREFIX = "mmqh"
SUPERNET = "10.77"
CMD_TIMEOUT_S = 10.0
_OURS = re.compile(rf"^{PREFIX}(\d+)")


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here; the message says why."""


@dataclass(frozen=True)
class NetHost:
    name: str
    """The test's name for it: "redis", "api", "w1"..."""
    netns: str
    port_dev: str
    """Its veth end in the root namespace (a bridge port): what `cut` sets down."""
    address: str

    def wrap(self) -> list[str]:
        """argv prefix that runs a command inside this host."""
        return ["ip", "netns", "exec", self.netns]


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`ip ARGS`, bounded; raises with its stderr if it fails and `check`."""
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass
class Network:
    """A bridge and the hosts on it; `close()` (or the context manager) removes them all."""

    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    hosts: dict[str, NetHost] = field(default_factory=dict)

    def __post_init__(self) -> None:
        remove_stale()
        self.bridge = self.tag
        self.subnet = free_subnet()
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.address_of(1)}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def address_of(self, n: int) -> str:
        return str(self.subnet.network_address + n)

    def add_host(self, name: str) -> NetHost:
        n = len(self.hosts)
        host = NetHost(name, f"{self.tag}-{n}", f"{self.tag}p{n}", self.address_of(10 + n))
        self.hosts[name] = host
        ip("netns", "add", host.netns)
        ip("link", "add", host.port_dev, "type", "veth", "peer", "name", "eth0",
           "netns", host.netns)  # fmt: skip
        ip("link", "set", host.port_dev, "master", self.bridge, "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", host.netns, "link", "set", "eth0", "up")
        ip("-n", host.netns, "link", "set", "lo", "up")
        return host

    def cut(self, host: NetHost) -> None:
        ip("link", "set", host.port_dev, "down")

    def restore(self, host: NetHost) -> None:
        ip("link", "set", host.port_dev, "up")

    @contextlib.contextmanager
    def partitioned(self, host: NetHost) -> Iterator[None]:
        """`host` cut off inside the block, restored after it whatever happens."""
        self.cut(host)
        try:
            yield
        finally:
            self.restore(host)

    def close(self) -> None:
        for host in self.hosts.values():
            kill_inside(host.netns)
            # At once: a namespace's own links go only when the kernel gets round to it.
            ip("link", "del", host.port_dev, check=False)
            remove_netns(host.netns)
        self.hosts.clear()
        ip("link", "del", self.bridge, check=False)


def pids_inside(netns: str) -> list[int]:
    """The processes running in `netns`."""
    return [int(pid) for pid in ip("netns", "pids", netns, check=False).stdout.split()]


def kill_inside(netns: str) -> None:
    """SIGKILL every process in `netns` (all of them started by a test in it)."""
    for pid in pids_inside(netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def remove_netns(netns: str) -> None:
    kill_inside(netns)
    ip("netns", "del", netns, check=False)  # its veth pairs go with it (soon after)


def remove_stale() -> None:
    """Delete the namespaces and links that earlier runs of this module left (their test
    process is gone)."""
    for netns in ip("netns", "list", check=False).stdout.split("\n"):
        name = netns.split(" ")[0]
        if _stale(name):
            remove_netns(name)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(": ")
        name = parts[1].split("@")[0] if len(parts) > 1 else ""
        if _stale(name):
            ip("link", "del", name, check=False)


def _stale(name: str) -> bool:
    match = _OURS.match(name)
    if match is None:
        return False
    try:
        os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def free_subnet() -> ipaddress.IPv4Network:
    """The first 10.77.N.0/24 that no address of this machine's root namespace is in."""
    taken = ip("-4", "-o", "addr", "show", check=False).stdout
    for n in range(256):
        subnet = ipaddress.IPv4Network(f"{SUPERNET}.{n}.0/24")
        if f" {SUPERNET}.{n}." not in taken:
            return subnet
    raise NetnsUnavailable(f"every {SUPERNET}.N.0/24 is in use")


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None if they can): a real attempt, as a
    namespace can be refused for reasons no check predicts (no CAP_SYS_ADMIN in a
    container, a kernel without them)."""
    if shutil.which("ip") is None:
        return "no `ip` binary (iproute2) on PATH"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    tag = f"{PREFIX}{os.getpid()}"
    probe, veth_end, bridge = f"{tag}-probe", f"{tag}v", f"{tag}b"
    attempts = (
        ("netns", "add", probe),
        ("link", "add", veth_end, "type", "veth", "peer", "name", "eth0", "netns", probe),
        ("link", "add", bridge, "type", "bridge"),
    )
    try:
        for args in attempts:
            done = ip(*args, check=False)
            if done.returncode != 0:
                return f"`ip {' '.join(args[:2])}` failed: {done.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip` failed: {exc}"
    finally:
        for link in (veth_end, bridge):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                ip("link", "del", link, check=False)
        remove_netns(probe)
    return None
