"""Test hosts on one machine: Linux network namespaces joined by a bridge.

`Network` (as root) makes a switch: a namespace of its own (`mmqh<pid>-sw`) that holds a
bridge. Per host a namespace whose `eth0` is one end of a veth pair; the other end is a
port of the bridge. The root namespace (the tests' client) joins the bridge the same way,
through a veth pair whose root end (`mmqh<pid>`) has the first address of a private /24
(10.77.N.0/24, the first N no address of this machine is in); the hosts get .10, .11...
Hosts reach each other and the root namespace over the bridge, and nothing else: no route
leaves the /24. `lo` is up inside each, so a host's own loopback works too. A process runs
inside with `ip netns exec NAME ...` (`NetHost.wrap`).

Why the bridge has a namespace of its own: with `br_netfilter` loaded, the frames a bridge
forwards go through the iptables FORWARD chain of the bridge's namespace
(`net.bridge.bridge-nf-call-iptables`, which is 1 in each new namespace). A Docker daemon
loads it and sets the root namespace's FORWARD policy to DROP, so a bridge in the root
namespace silently dropped all traffic between hosts and every test errored at setup.
Rules, policies and those sysctls are per namespace, and the switch's starts with none:
its bridge forwards whatever the root namespace's firewall holds, and the tests change no
firewall. The root namespace's own traffic to a host is not forwarded there: it leaves and
enters through its veth end (OUTPUT and INPUT), as any local traffic does.

`cut(host)` sets the host's port on the bridge down (in the switch): the cable pulled, so
its packets vanish both ways and nothing refuses a connection (a peer sees only silence,
as on a real partition; `tc netem` is not available here, so no latency or loss short of
that). `restore(host)` sets it up again; TCP connections that were open carry on.

Every `ip` command is bounded (`CMD_TIMEOUT_S`). Clean-up always happens (`close`, also on
a failed setup): every process still in one of the namespaces is killed, the root
namespace's veth end deleted, and the namespaces (with the veth pairs that have an end in
them). Names carry the pid of the test process (`mmqh<pid>`), so a run removes what earlier
runs that died left behind (their pid is gone) and never touches a live run's hosts.

`unavailable()` builds a small such network and sends it a packet, so that where this
cannot work the tests skip, saying why, instead of erroring.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

PREFIX = "mmqh"
SUPERNET = "10.77"
CMD_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 3.0
BRIDGE = "br0"
"""The bridge's name in a switch namespace (names there are the switch's own)."""
UPLINK = "uplink"
"""The switch's end of the root namespace's veth pair: a port of the bridge."""
_OURS = re.compile(rf"^{PREFIX}(\d+)")


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here; the message says why."""


@dataclass(frozen=True)
class NetHost:
    name: str
    """The test's name for it: "redis", "api", "w1"..."""
    netns: str
    port_dev: str
    """Its veth end in the switch namespace (a bridge port): what `cut` sets down."""
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
    """A switch (a bridge in a namespace of its own), the root namespace and the hosts on
    it; `close()` (or the context manager) removes them all."""

    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    hosts: dict[str, NetHost] = field(default_factory=dict)

    def __post_init__(self) -> None:
        remove_stale()
        self.switch = f"{self.tag}-sw"
        self.uplink = self.tag  # the root namespace's veth end, with the /24's first address
        try:
            ip("netns", "add", self.switch)
            ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
            ip("-n", self.switch, "link", "set", BRIDGE, "up")
            ip("link", "add", self.uplink, "type", "veth", "peer", "name", UPLINK,
               "netns", self.switch)  # fmt: skip
            ip("-n", self.switch, "link", "set", UPLINK, "master", BRIDGE, "up")
            with _subnet_lock():  # another test process (pytest-xdist) picks one too
                self.subnet = free_subnet()
                ip("addr", "add", f"{self.address_of(1)}/24", "dev", self.uplink)
            ip("link", "set", self.uplink, "up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def address_of(self, n: int) -> str:
        return str(self.subnet.network_address + n)

    def add_host(self, name: str) -> NetHost:
        n = len(self.hosts)
        host = NetHost(name, f"{self.tag}-{n}", f"{self.tag}p{n}", self.address_of(10 + n))
        self.hosts[name] = host
        ip("netns", "add", host.netns)
        ip("-n", self.switch, "link", "add", host.port_dev, "type", "veth", "peer",
           "name", "eth0", "netns", host.netns)  # fmt: skip
        ip("-n", self.switch, "link", "set", host.port_dev, "master", BRIDGE, "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", host.netns, "link", "set", "eth0", "up")
        ip("-n", host.netns, "link", "set", "lo", "up")
        return host

    def cut(self, host: NetHost) -> None:
        ip("-n", self.switch, "link", "set", host.port_dev, "down")

    def restore(self, host: NetHost) -> None:
        ip("-n", self.switch, "link", "set", host.port_dev, "up")

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
            remove_netns(host.netns)
        self.hosts.clear()
        # At once: a namespace's links go only when the kernel gets round to it, and this
        # one holds the /24's first address in the root namespace.
        ip("link", "del", self.uplink, check=False)
        remove_netns(self.switch)


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


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    """Held from choosing a free /24 until its first address is on a link: no two processes
    of this machine choose the same one."""
    with open(f"/tmp/{PREFIX}-subnets.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def free_subnet() -> ipaddress.IPv4Network:
    """The first 10.77.N.0/24 that no address of this machine's root namespace is in."""
    taken = ip("-4", "-o", "addr", "show", check=False).stdout
    for n in range(256):
        subnet = ipaddress.IPv4Network(f"{SUPERNET}.{n}.0/24")
        if f" {SUPERNET}.{n}." not in taken:
            return subnet
    raise NetnsUnavailable(f"every {SUPERNET}.N.0/24 is in use")


def unavailable() -> str | None:
    """Why test hosts cannot be made here (None if they can): a real attempt, a `Network`
    with one host that must answer the root namespace, as a namespace can be refused, or
    traffic between namespaces dropped, for reasons no check predicts (no CAP_SYS_ADMIN
    in a container, a kernel without them, a firewall)."""
    if shutil.which("ip") is None:
        return "no `ip` binary (iproute2) on PATH"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    try:
        with Network(tag=f"{PREFIX}{os.getpid()}q") as probe:
            return _no_answer(probe.add_host("probe").address)
    except RuntimeError as exc:  # NetnsUnavailable, or `ip ARGS: its stderr`
        return str(exc)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip` failed: {exc}"


def _no_answer(address: str) -> str | None:
    """None if a host at `address` answers a TCP connection from the root namespace (a
    refusal: nothing listens there); else what happened instead."""
    try:
        with socket.create_connection((address, 9), timeout=PROBE_TIMEOUT_S):
            return None
    except ConnectionRefusedError:
        return None
    except OSError as exc:
        return (
            f"a test host at {address} does not answer the root namespace over the switch "
            f"(a TCP connection to it: {exc or type(exc).__name__}): something drops the "
            "traffic between them (the root namespace's INPUT or OUTPUT firewall?)"
        )
