"""Which URLs the cell may call: registered targets and webhooks, never its own network.

In production mode a URL whose host is, or resolves to, a loopback,
link-local (cloud metadata lives at 169.254.169.254), private, multicast or
unspecified address is refused, so a tenant cannot make the cell call into the
platform's own network (SSRF). Development mode allows loopback and private
addresses, for local tests; link-local metadata addresses stay refused always.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

__all__ = ["check_url", "UrlRefused"]

_METADATA_HOSTS = {"metadata.google.internal", "metadata", "instance-data"}


class UrlRefused(ValueError):
    """The URL may not be called; the message says why."""


def check_url(url: str, *, allow_private: bool,
              resolve: Callable[[str], Iterable[str]]) -> str:
    """Returns the URL if it may be called; raises ``UrlRefused`` otherwise.

    ``resolve`` maps a host name to its addresses (the adapter passes DNS).
    """
    if len(url) > 2048:
        raise UrlRefused("URL is longer than 2048 characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UrlRefused(f"scheme {parts.scheme!r} is not http or https")
    if parts.username or parts.password:
        raise UrlRefused("URLs with credentials are refused")
    host = parts.hostname
    if not host:
        raise UrlRefused("URL has no host")
    if host.lower() in _METADATA_HOSTS:
        raise UrlRefused(f"host {host} is a cloud metadata service")
    try:
        addresses = [host] if _is_ip(host) else list(resolve(host))
    except OSError as error:
        raise UrlRefused(f"host {host} does not resolve: {error}") from None
    if not addresses:
        raise UrlRefused(f"host {host} does not resolve")
    for address in addresses:
        _check_address(ipaddress.ip_address(address.split("%")[0]), host, allow_private)
    return url


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _check_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, host: str,
                   allow_private: bool) -> None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        raise UrlRefused(f"host {host} is at {ip}, a link-local, multicast or reserved address")
    if allow_private:
        return
    if ip.is_loopback or ip.is_private or not ip.is_global:
        raise UrlRefused(f"host {host} is at {ip}, an address inside the platform's network")
