"""Which URLs and addresses the cell may call: tenants' targets and webhooks, never its own network.

One policy, whatever way a URL came in (registered through the admin API,
imported, moved in from another cell) and again at every call: the host is
resolved, every address it resolves to is judged here, and the connection goes
to an address that was judged (``cellplane_cells.egress``), so a name that
resolves elsewhere between the check and the call (DNS rebinding) gains nothing.

In production mode (``allow_private`` False) an address that is loopback,
private, unique-local, shared (CGNAT), documentation or otherwise not globally
routable is refused, so a tenant cannot make the cell call into the platform's
own network (SSRF). Development mode allows loopback and private addresses,
for local tests. Link-local (cloud metadata lives at 169.254.169.254),
multicast, reserved and unspecified addresses (0.0.0.0 reaches the local host
on Linux) are refused in both modes.

IPv6 addresses that carry an IPv4 address (IPv4-mapped, IPv4-compatible,
IPv4-translated, 6to4, Teredo, NAT64) are judged by the IPv4 address they
carry: the packets end up there. Hosts that spell an IPv4 address in a legacy
numeric form (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``), which
resolvers accept and people misread, are refused outright.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

__all__ = ["check_url", "check_host_addresses", "address_refusal", "embedded_ipv4", "ip_literal",
           "legacy_ipv4", "UrlRefused", "IPAddress"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_METADATA_HOSTS = {"metadata.google.internal", "metadata", "instance-data"}

_NEVER_V4 = (ipaddress.ip_network("0.0.0.0/8"),)
"""'This network': 0.0.0.0 and its neighbours reach the local host on Linux."""

_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
_NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL_USE = ipaddress.ip_network("64:ff9b:1::/48")
"""RFC 8215: where the IPv4 address sits depends on the operator's prefix length, so it
cannot be read back; never globally routable. (It lies in ::/8, reserved as a whole,
so development mode refuses it too.)"""


class UrlRefused(ValueError):
    """The URL (or address) may not be called; the message says why."""


def check_url(url: str, *, allow_private: bool,
              resolve: Callable[[str], Iterable[str]]) -> str:
    """Returns the URL if it may be called; raises ``UrlRefused`` otherwise.

    ``resolve`` maps a host name to its addresses (the adapter passes DNS).
    """
    host = _host_of(url)
    literal = ip_literal(host)
    try:
        addresses = [str(literal)] if literal is not None else list(resolve(host))
    except OSError as error:
        raise UrlRefused(f"host {host} does not resolve: {error}") from None
    check_host_addresses(host, addresses, allow_private=allow_private)
    return url


def check_host_addresses(host: str, addresses: Iterable[str], *,
                         allow_private: bool) -> list[IPAddress]:
    """The addresses ``host`` resolved to, parsed, if every one may be called; raises
    ``UrlRefused`` naming the first that may not (a name with one private address
    among public ones is refused: which one a connection gets is not ours to pick)."""
    if host.lower().rstrip(".") in _METADATA_HOSTS:
        raise UrlRefused(f"host {host} is a cloud metadata service")
    parsed: list[IPAddress] = []
    for address in addresses:
        try:
            ip = ipaddress.ip_address(address.split("%")[0])
        except ValueError:
            raise UrlRefused(f"host {host} resolved to {address!r}, not an IP address") from None
        refusal = address_refusal(ip, allow_private=allow_private)
        if refusal is not None:
            shown = host if host == str(ip) else f"{host} (at {ip})"
            raise UrlRefused(f"host {shown}: {refusal}")
        parsed.append(ip)
    if not parsed:
        raise UrlRefused(f"host {host} does not resolve")
    return parsed


def address_refusal(ip: IPAddress, *, allow_private: bool) -> str | None:
    """Why the cell may not connect to ``ip``, or None if it may."""
    carried = embedded_ipv4(ip)
    if carried:
        for inner in carried:
            refusal = _v4_refusal(inner, allow_private)
            if refusal is not None:
                return f"{ip} carries the IPv4 address {inner}, {refusal}"
        return None
    if isinstance(ip, ipaddress.IPv4Address):
        return _v4_refusal(ip, allow_private)
    if ip.is_loopback:
        # Before the reserved test: ::1 lies in ::/8, which is reserved as a whole.
        return None if allow_private else "the loopback address"
    if ip.is_unspecified or ip.is_link_local or ip.is_multicast or ip.is_site_local \
            or ip.is_reserved:
        return "an unspecified, link-local, multicast or reserved address"
    if allow_private:
        return None
    if ip.is_private or not ip.is_global or ip in _NAT64_LOCAL_USE:
        return "an address inside the platform's network (loopback, unique-local or not global)"
    return None


def _v4_refusal(ip: ipaddress.IPv4Address, allow_private: bool) -> str | None:
    if ip.is_unspecified or ip.is_link_local or ip.is_multicast or ip.is_reserved \
            or any(ip in network for network in _NEVER_V4):
        return "an unspecified, link-local, multicast or reserved address"
    if allow_private:
        return None
    if ip.is_loopback or ip.is_private or not ip.is_global:
        return "an address inside the platform's network (loopback, private or not global)"
    return None


def embedded_ipv4(ip: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address carries (where its packets end up); () if none."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ()
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,)
    if ip in _IPV4_TRANSLATED or ip in _NAT64_WELL_KNOWN:
        return (low32,)
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:
        # ::/96 holds :: and ::1 too, which are themselves; the rest carry an IPv4 address.
        return (low32,)
    if ip.sixtofour is not None:
        return (ip.sixtofour,)
    if ip.teredo is not None:
        server, client = ip.teredo
        return (server, client)
    return ()


def legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a legacy numeric spelling means (as ``inet_aton`` reads it: one to
    four parts, each decimal, octal with a leading 0 or hex with 0x); None if ``host``
    is not one. The canonical dotted-decimal form is not legacy."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        text = part.lower()
        try:
            if text.startswith("0x"):
                value = int(text[2:] or "0", 16)
            elif len(text) > 1 and text.startswith("0"):
                value = int(text, 8)
            else:
                value = int(text, 10) if text.isascii() and text.isdigit() else -1
        except ValueError:
            return None
        if value < 0:
            return None
        values.append(value)
    *leading, last = values
    if any(v > 255 for v in leading) or last >= 256 ** (5 - len(values)):
        return None
    number = last
    for index, value in enumerate(leading):
        number += value << (8 * (3 - index))
    address = ipaddress.IPv4Address(number)
    return None if str(address) == host else address


def _host_of(url: str) -> str:
    if len(url) > 2048:
        raise UrlRefused("URL is longer than 2048 characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError as error:
        raise UrlRefused(f"URL does not parse: {error}") from None
    if parts.scheme not in ("http", "https"):
        raise UrlRefused(f"scheme {parts.scheme!r} is not http or https")
    if parts.username or parts.password:
        raise UrlRefused("URLs with credentials are refused")
    host = parts.hostname
    if not host:
        raise UrlRefused("URL has no host")
    return host


def ip_literal(host: str) -> IPAddress | None:
    """The address ``host`` is written as, or None for a name; legacy spellings refused."""
    try:
        return ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        pass
    legacy = legacy_ipv4(host.rstrip("."))
    if legacy is not None:
        raise UrlRefused(f"host {host} spells the IPv4 address {legacy} in a legacy numeric "
                         f"form; write it as {legacy}")
    return None
