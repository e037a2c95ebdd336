"""The SSRF guard: outbound HTTP from mmq reaches public addresses only.

Input URLs and webhook URLs are checked twice: when the API accepts them (`check_url`,
an `InputError` naming the field), and again at connect time (`GuardedTransport`), where
the address actually connected to is the one that was checked, so neither DNS rebinding
nor a redirect gets through. Refused unless `net.allow_private_addresses` or
`net.allowed_networks` says otherwise: loopback, private, shared, link-local, multicast,
reserved, unspecified and every other non-global range, for IPv4 and IPv6 alike, and
IPv4 addresses wrapped in IPv6 (mapped, 6to4, Teredo, NAT64).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

from jobs.errors import InputError
from jobs.settings import NetSettings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SPECIAL = (
    ("is_loopback", "loopback"),
    ("is_unspecified", "unspecified"),
    ("is_link_local", "link-local"),
    ("is_multicast", "multicast"),
    ("is_reserved", "reserved"),
    ("is_private", "private"),
)


ALLOW_PRIVATE = (
    "a deployment that trusts its network lets such addresses through with "
    "net.allow_private_addresses, MMQ_NET__ALLOW_PRIVATE_ADDRESSES=true, or names them "
    "in net.allowed_networks"
)
"""The setting that would let a refused address through, said with every refusal: a
webhook receiver or input URL on the deployment's own network is refused until it is set."""


class AddressRefused(Exception):
    """A host that resolves to an address the policy refuses."""


@dataclass(frozen=True)
class NetPolicy:
    allow_private: bool = False
    allowed_networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def from_settings(cls, net: NetSettings) -> NetPolicy:
        networks = tuple(ipaddress.ip_network(c, strict=False) for c in net.allowed_networks)
        return cls(net.allow_private_addresses, networks)

    def refusal(self, address: IPAddress) -> str | None:
        """Why `address` may not be reached, or None when it may."""
        if self.allow_private:
            return None
        forms = embedded_forms(address)
        if any(form in network for form in forms for network in self.allowed_networks):
            return None
        for form in forms:
            reason = special_range(form)
            if reason:
                return reason
        return None


def embedded_forms(address: IPAddress) -> list[IPAddress]:
    """The addresses to judge: an IPv4-mapped or NAT64 address stands for its IPv4
    address alone; a 6to4 or Teredo address for itself and the IPv4 address inside."""
    if isinstance(address, ipaddress.IPv4Address):
        return [address]
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address in _NAT64:
        return [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)]
    teredo = address.teredo
    inner = [address.sixtofour, teredo[1] if teredo else None]
    return [address, *(v4 for v4 in inner if v4 is not None)]


def special_range(address: IPAddress) -> str | None:
    for attribute, label in _SPECIAL:
        if getattr(address, attribute):
            return label
    return None if address.is_global else "non-public"


def resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses of `host` (an IP literal is its own address). Raises OSError."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[IPAddress, None] = {}
    for info in infos:
        seen[ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])] = None
    return list(seen)


def checked_addresses(host: str, port: int, policy: NetPolicy) -> list[IPAddress]:
    """`host`'s addresses; `AddressRefused` if any of them is refused."""
    addresses = resolve(host, port)
    for address in addresses:
        reason = policy.refusal(address)
        if reason:
            raise AddressRefused(f"{host} resolves to {address}, a {reason} address")
    return addresses


def check_url(url: str, field: str, policy: NetPolicy) -> None:
    """Raise `InputError` naming `field` unless `url` is http(s) to an allowed host."""
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"}:
        raise InputError(field, "must be an http:// or https:// URL")
    try:
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InputError(field, "has an invalid port") from None
    if not host:
        raise InputError(field, "has no host")
    try:
        checked_addresses(host, port, policy)
    except AddressRefused as exc:
        raise InputError(field, f"is not allowed: {exc} ({ALLOW_PRIVATE})") from None
    except (OSError, UnicodeError):
        raise InputError(field, f"host {host!r} does not resolve") from None


class _GuardedBackend(httpcore.SyncBackend):
    """Connects only to addresses the policy allows, and only to those it checked."""

    def __init__(
        self, policy: NetPolicy, on_connect: Callable[[socket.socket], None] | None = None
    ) -> None:
        self.policy = policy
        self.on_connect = on_connect

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        last_error: Exception | None = None
        for address in checked_addresses(host, port, self.policy):
            try:
                stream = super().connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                last_error = exc
                continue
            if self.on_connect is not None:
                self.on_connect(stream.get_extra_info("socket"))
            return stream
        raise last_error or httpcore.ConnectError(f"no address for {host}")


class GuardedTransport(httpx.HTTPTransport):
    """An httpx transport whose every connection (redirects included) passes the policy.

    Proxies from the environment are ignored: through a proxy, the address connected to
    would be the proxy's, not the one that was checked.
    """

    def __init__(
        self,
        policy: NetPolicy,
        *,
        verify: bool = True,
        on_connect: Callable[[socket.socket], None] | None = None,
    ) -> None:
        """`on_connect` is given each connection's socket as it opens (to stop it from
        another thread: `storage.fetch`'s deadline and cancel)."""
        super().__init__(verify=verify, trust_env=False)
        # httpx offers no public way to give its transport a network backend, so the
        # connection pool is built again here with one.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            network_backend=_GuardedBackend(policy, on_connect),
        )
