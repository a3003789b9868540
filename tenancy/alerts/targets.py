"""Where a webhook may point: the server-side request forgery guard.

A webhook URL is typed by a tenant and fetched by the gateway, from inside the operator's
network; unguarded, it reaches the cloud metadata service (169.254.169.254), the database, Redis
or an admin port on loopback. So:

- only `http` and `https`, no user name or password in the URL, a host of at most 253 bytes;
- every address the host resolves to must be public (`ipaddress`'s `is_global`: not loopback,
  private, link-local, shared, reserved or multicast; IPv4-mapped IPv6 is judged as IPv4),
  unless `LORAGATE_ALERTS__ALLOW_PRIVATE_URLS` is set (tests, development);
- the check runs when the URL is configured (a clear 400) and again before every attempt, and
  the attempt connects to the very address that was checked (`ResolvedTarget`: the URL's host
  replaced by it, the name kept for `Host` and TLS's SNI and certificate check), so a name that
  re-resolves to a private address between the check and the connection (DNS rebinding) is
  never followed; redirects are never followed either.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

import httpx

from tenancy.errors import BadRequest

SCHEMES = ("http", "https")
MAX_URL_LENGTH = 2048


class TargetRefused(Exception):
    """The URL may not be reached; the message names why, never more than the host."""


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id is not an address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def parse_url(url: str) -> httpx.URL:
    """The URL's shape, or TargetRefused (no network access)."""
    if len(url) > MAX_URL_LENGTH:
        raise TargetRefused(f"the URL is longer than {MAX_URL_LENGTH} characters")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise TargetRefused("the URL cannot be parsed") from exc
    if parsed.scheme not in SCHEMES:
        raise TargetRefused("only http and https URLs are allowed")
    if parsed.userinfo:
        raise TargetRefused("the URL may not carry a user name or password")
    if not parsed.host or len(parsed.host) > 253:
        raise TargetRefused("the URL has no valid host")
    return parsed


@dataclass(frozen=True)
class ResolvedTarget:
    url: httpx.URL  # the host replaced by the checked address
    host_header: str
    sni_hostname: str | None  # https only


async def _addresses(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise TargetRefused(f"the host {host!r} does not resolve") from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def resolve(url: str, *, allow_private: bool) -> ResolvedTarget:
    """Check the URL and every address its host resolves to; raises TargetRefused."""
    parsed = parse_url(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    addresses = await _addresses(parsed.host, port)
    if not addresses:
        raise TargetRefused(f"the host {parsed.host!r} does not resolve")
    if not allow_private:
        blocked = [a for a in addresses if not is_public_address(a)]
        if blocked:
            raise TargetRefused(
                f"the host {parsed.host!r} resolves to a private, loopback or reserved address"
            )
    address = addresses[0]
    host_in_url = f"[{address}]" if ":" in address else address
    default_port = parsed.port is None
    host_header = parsed.host if default_port else f"{parsed.host}:{parsed.port}"
    if ":" in parsed.host:  # an IPv6 literal keeps its brackets in Host
        host_header = f"[{parsed.host}]" + ("" if default_port else f":{parsed.port}")
    return ResolvedTarget(
        url=parsed.copy_with(host=host_in_url.strip("[]")),
        host_header=host_header,
        sni_hostname=parsed.host if parsed.scheme == "https" else None,
    )


async def check_webhook_url(url: str, *, allow_private: bool) -> str:
    """For the admin API: the URL as given, or a 400 naming `url` and the reason."""
    try:
        await resolve(url, allow_private=allow_private)
    except TargetRefused as exc:
        raise BadRequest(f"The webhook URL is refused: {exc}.", param="url") from None
    return url
