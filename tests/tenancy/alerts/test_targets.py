"""SECURITY.md, webhook URLs (the adapter-URL line's twin): a webhook is a request the gateway
makes from inside the operator's network, so by default only public http(s) addresses are
reached: the schemes, credentials, loopback, private, link-local (cloud metadata), shared and
reserved ranges, IPv4-mapped IPv6 and numeric host forms are refused when the URL is set (400
naming `url`) and again at delivery; the attempt connects to the address that was checked."""

from __future__ import annotations

import pytest

from tenancy.alerts.targets import TargetRefused, check_webhook_url, is_public_address, resolve
from tenancy.errors import BadRequest

REFUSED = [
    "ftp://93.184.216.34/hook",
    "file:///etc/passwd",
    "gopher://93.184.216.34:70/",
    "javascript:alert(1)",
    "http://user:pass@93.184.216.34/hook",
    "http://127.0.0.1/hook",
    "http://127.1/hook",
    "http://2130706433/hook",  # 127.0.0.1 as one number
    "http://0x7f000001/hook",
    "http://localhost:6379/",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:169.254.169.254]/latest/meta-data/",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.5/hook",
    "http://172.16.3.4/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",  # shared address space (carrier NAT)
    "http://0.0.0.0:8000/",
    "http://[fe80::1]/hook",
    "http://[fd00::1]/hook",
    "http://224.0.0.1/hook",
    "http://240.0.0.1/hook",
    "http:///hook",
    "http://" + "a" * 300 + ".example/hook",
    "https://93.184.216.34/" + "x" * 2100,
]


@pytest.mark.parametrize("url", REFUSED)
async def test_refused_by_default(url: str) -> None:
    with pytest.raises(BadRequest) as caught:
        await check_webhook_url(url, allow_private=False)
    assert caught.value.param == "url"
    assert caught.value.status_code == 400
    with pytest.raises(TargetRefused):  # and again at delivery
        await resolve(url, allow_private=False)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost:9/x",
        "http://[::1]:8080/",
        "http://10.1.2.3/",
    ],
)
async def test_private_addresses_only_when_allowed(url: str) -> None:
    assert await check_webhook_url(url, allow_private=True) == url


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/", "http://u:p@127.0.0.1/", "file:///etc/passwd"])
async def test_allowing_private_addresses_never_allows_other_schemes_or_credentials(
    url: str,
) -> None:
    with pytest.raises(BadRequest):
        await check_webhook_url(url, allow_private=True)


async def test_a_public_address_is_connected_to_as_checked() -> None:
    target = await resolve("https://93.184.216.34:8443/hooks?x=1", allow_private=False)
    assert str(target.url) == "https://93.184.216.34:8443/hooks?x=1"
    assert target.host_header == "93.184.216.34:8443"
    assert target.sni_hostname == "93.184.216.34"


async def test_a_name_is_replaced_by_its_checked_address() -> None:
    # what defeats DNS rebinding: the connection goes to the address that passed the check,
    # the name stays in Host (and in SNI and the certificate check for https)
    target = await resolve("https://localhost:8443/hook", allow_private=True)
    assert target.url.host in {"127.0.0.1", "::1"}
    assert target.host_header == "localhost:8443"
    assert target.sni_hostname == "localhost"
    plain = await resolve("http://localhost/hook", allow_private=True)
    assert plain.host_header == "localhost" and plain.sni_hostname is None


def test_address_classes() -> None:
    assert is_public_address("93.184.216.34")
    assert is_public_address("2606:2800:220:1:248:1893:25c8:1946")
    for private in (
        "127.0.0.1",
        "10.0.0.1",
        "169.254.169.254",
        "::1",
        "::ffff:10.0.0.1",
        "fc00::1",
    ):
        assert not is_public_address(private), private
