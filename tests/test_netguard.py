"""The SSRF guard: address ranges, URL checks, and refusal at connect time (redirects too)."""

from __future__ import annotations

import ipaddress

import httpx
import pytest

from harness.storage_servers import http_server
from jobs.errors import InputError
from jobs.settings import NetSettings
from security.netguard import AddressRefused, GuardedTransport, NetPolicy, check_url

REFUSED = {
    "127.0.0.1": "loopback",
    "127.8.9.10": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "169.254.169.254": "link-local",
    "100.64.0.1": "non-public",
    "0.0.0.0": "unspecified",
    "224.0.0.1": "multicast",
    "240.0.0.1": "reserved",
    "255.255.255.255": "reserved",
    "198.18.0.1": "private",
    "192.0.2.1": "private",
    "::1": "loopback",
    "::": "unspecified",
    "fe80::1": "link-local",
    "fc00::1": "private",
    "ff02::1": "multicast",
    "::ffff:127.0.0.1": "loopback",
    "::ffff:10.0.0.1": "private",
    "::ffff:169.254.169.254": "link-local",
    "64:ff9b::7f00:1": "loopback",
    "2002:7f00:1::1": "loopback",
    "2001:db8::1": "private",
}
ALLOWED = ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize(("address", "reason"), REFUSED.items())
def test_special_addresses_are_refused(address: str, reason: str) -> None:
    assert NetPolicy().refusal(ipaddress.ip_address(address)) == reason
    assert NetPolicy(allow_private=True).refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_are_allowed(address: str) -> None:
    assert NetPolicy().refusal(ipaddress.ip_address(address)) is None


def test_allowed_networks_open_only_their_range() -> None:
    policy = NetPolicy.from_settings(NetSettings(allowed_networks=["10.1.2.0/24"]))
    assert policy.refusal(ipaddress.ip_address("10.1.2.99")) is None
    assert policy.refusal(ipaddress.ip_address("::ffff:10.1.2.99")) is None
    assert policy.refusal(ipaddress.ip_address("10.1.3.1")) == "private"
    with pytest.raises(ValueError):
        NetSettings(allowed_networks=["not-a-cidr"])


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://example.com/a.wav", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("gopher://127.0.0.1:6379/_FLUSHALL", "http:// or https://"),
        ("http:///nohost", "no host"),
        ("http://example.com:99999/", "invalid port"),
        ("http://localhost:8000/", "loopback"),
        ("http://127.0.0.1/", "loopback"),
        ("http://[::1]:8080/x", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://2130706433/", "loopback"),
        ("http://0x7f.0.0.1/", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("https://10.0.0.5/a.wav", "private"),
        ("http://nonexistent.invalid/a.wav", "does not resolve"),
    ],
)
def test_check_url_names_the_field_and_the_reason(url: str, reason: str) -> None:
    with pytest.raises(InputError) as caught:
        check_url(url, "input.audio", NetPolicy())
    assert caught.value.field == "input.audio"
    assert reason in caught.value.reason


def test_check_url_lets_public_and_allowed_hosts_through() -> None:
    check_url("https://8.8.8.8/a.wav", "input.audio", NetPolicy())
    check_url("http://localhost:8000/", "webhook.url", NetPolicy(allow_private=True))


def test_transport_refuses_a_private_address_at_connect_time() -> None:
    with http_server() as base, httpx.Client(transport=GuardedTransport(NetPolicy())) as client:
        for url in (f"{base}/bytes/10", base.replace("127.0.0.1", "localhost") + "/bytes/10"):
            with pytest.raises(AddressRefused, match="loopback"):
                client.get(url)


def test_transport_checks_every_redirect_hop() -> None:
    only_first = NetPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.1/32"),))
    transport = GuardedTransport(only_first)
    with (
        http_server() as base,
        http_server("127.0.0.2") as other,
        httpx.Client(transport=transport, follow_redirects=True) as client,
    ):
        assert len(client.get(f"{base}/bytes/100").content) == 100
        with pytest.raises(AddressRefused, match=r"127\.0\.0\.2"):
            client.get(f"{base}/redirect?to={other}/bytes/10")
        open_policy = GuardedTransport(NetPolicy(allow_private=True))
        with httpx.Client(transport=open_policy, follow_redirects=True) as open_client:
            assert len(open_client.get(f"{base}/redirect?to={other}/bytes/10").content) == 10
