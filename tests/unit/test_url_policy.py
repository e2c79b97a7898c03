"""The cell's one URL policy (domain/targets.py): a table of addresses in both modes.

Every row says what production mode (allow_private False) and development mode
(True) decide for one address, spelled as a URL's host. The embedded-IPv4 rows
are the ones that passed before the policy judged them by the address they carry.
"""

from __future__ import annotations

import ipaddress

import pytest

from cellplane_cells.domain.targets import (
    UrlRefused, address_refusal, check_host_addresses, check_url, embedded_ipv4, legacy_ipv4,
)


def no_dns(host: str) -> list[str]:
    raise AssertionError(f"{host} is an address: nothing to resolve")


OK, NO = True, False

ADDRESSES = [
    # host in the URL               production  development
    ("93.184.216.34",                 OK,         OK),   # public IPv4
    ("[2606:4700::6810:84e5]",        OK,         OK),   # public IPv6
    ("127.0.0.1",                     NO,         OK),   # loopback
    ("127.9.9.9",                     NO,         OK),
    ("10.1.2.3",                      NO,         OK),   # private
    ("172.16.0.1",                    NO,         OK),
    ("192.168.1.1",                   NO,         OK),
    ("100.64.0.1",                    NO,         OK),   # shared address space (CGNAT)
    ("198.18.0.1",                    NO,         OK),   # benchmarking
    ("192.0.2.1",                     NO,         OK),   # documentation
    ("169.254.169.254",               NO,         NO),   # link-local: cloud metadata
    ("0.0.0.0",                       NO,         NO),   # unspecified: the local host
    ("0.1.2.3",                       NO,         NO),   # 'this network'
    ("224.0.0.1",                     NO,         NO),   # multicast
    ("240.0.0.1",                     NO,         NO),   # reserved
    ("255.255.255.255",               NO,         NO),   # broadcast
    ("[::1]",                         NO,         OK),   # IPv6 loopback
    ("[::]",                          NO,         NO),   # IPv6 unspecified
    ("[fc00::1]",                     NO,         OK),   # unique-local (ULA)
    ("[fd12:3456:789a::1]",           NO,         OK),
    ("[fe80::1]",                     NO,         NO),   # link-local
    ("[fe80::1%25eth0]",              NO,         NO),   # link-local with a zone
    ("[fec0::1]",                     NO,         NO),   # site-local (deprecated)
    ("[ff02::1]",                     NO,         NO),   # multicast
    ("[2001:db8::1]",                 NO,         OK),   # documentation
    # IPv6 addresses that carry an IPv4 address: judged by the address they carry.
    ("[::ffff:127.0.0.1]",            NO,         OK),   # IPv4-mapped
    ("[::ffff:169.254.169.254]",      NO,         NO),
    ("[::ffff:93.184.216.34]",        OK,         OK),
    ("[::127.0.0.1]",                 NO,         OK),   # IPv4-compatible
    ("[::169.254.169.254]",           NO,         NO),
    ("[::ffff:0:127.0.0.1]",          NO,         OK),   # IPv4-translated (SIIT)
    ("[2002:7f00:1::]",               NO,         OK),   # 6to4 of 127.0.0.1 (passed before)
    ("[2002:a9fe:a9fe::1]",           NO,         NO),   # 6to4 of 169.254.169.254
    ("[2002:0a00:0001::1]",           NO,         OK),   # 6to4 of 10.0.0.1
    ("[2002:5db8:d822::1]",           OK,         OK),   # 6to4 of 93.184.216.34
    ("[64:ff9b::7f00:1]",             NO,         OK),   # NAT64 of 127.0.0.1
    ("[64:ff9b::a9fe:a9fe]",          NO,         NO),   # NAT64 of 169.254.169.254
    ("[64:ff9b::5db8:d822]",          OK,         OK),   # NAT64 of 93.184.216.34
    ("[64:ff9b:1::7f00:1]",           NO,         NO),   # NAT64 local-use: unreadable
    # Teredo: server 65.54.227.120, client 127.0.0.1 (stored inverted).
    ("[2001:0:4136:e378:8000:63bf:80ff:fffe]", NO, OK),
    # Teredo whose client is 169.254.169.254.
    ("[2001:0:4136:e378:8000:63bf:5601:5601]", NO, NO),
]


@pytest.mark.parametrize(("host", "production", "development"), ADDRESSES)
def test_the_policy_of_each_address(host: str, production: bool, development: bool) -> None:
    url = f"http://{host}:8080/run"
    for allow_private, allowed in ((False, production), (True, development)):
        if allowed:
            assert check_url(url, allow_private=allow_private, resolve=no_dns) == url
        else:
            with pytest.raises(UrlRefused):
                check_url(url, allow_private=allow_private, resolve=no_dns)


@pytest.mark.parametrize(("host", "meant"), [
    ("2130706433", "127.0.0.1"),       # one decimal number
    ("0x7f000001", "127.0.0.1"),       # one hex number
    ("017700000001", "127.0.0.1"),     # one octal number
    ("0177.0.0.1", "127.0.0.1"),       # octal part
    ("0x7f.0.0.1", "127.0.0.1"),       # hex part
    ("127.1", "127.0.0.1"),            # two parts
    ("127.0.1", "127.0.0.1"),          # three parts
    ("127.0.0.01", "127.0.0.1"),       # a leading zero
    ("3627734562", "216.58.214.34"),   # a public address too: no legacy spelling passes
    ("0xA9.0xFE.0xA9.0xFE", "169.254.169.254"),
])
def test_legacy_ipv4_spellings_are_refused_in_both_modes(host: str, meant: str) -> None:
    assert legacy_ipv4(host) == ipaddress.IPv4Address(meant)
    for allow_private in (False, True):
        with pytest.raises(UrlRefused, match=f"legacy numeric form; write it as {meant}"):
            check_url(f"http://{host}/", allow_private=allow_private, resolve=no_dns)


@pytest.mark.parametrize("host", ["127.0.0.1", "example.com", "1.2.3.4.5", "08.1.1.1",
                                  "256.1.1.1", "1.2.3.0x100", "", "a.1"])
def test_not_legacy(host: str) -> None:
    assert legacy_ipv4(host) is None


def test_a_name_is_judged_by_every_address_it_resolves_to() -> None:
    both = {"mixed.example": ["93.184.216.34", "10.0.0.5"]}.__getitem__
    with pytest.raises(UrlRefused, match="10.0.0.5"):
        check_url("https://mixed.example/", allow_private=False, resolve=both)
    mapped = {"sneaky.example": ["::ffff:127.0.0.1"]}.__getitem__
    with pytest.raises(UrlRefused, match="carries the IPv4 address 127.0.0.1"):
        check_url("https://sneaky.example/", allow_private=False, resolve=mapped)
    public = {"hooks.example": ["93.184.216.34", "2606:4700::6810:84e5"]}.__getitem__
    assert check_url("https://hooks.example/x", allow_private=False, resolve=public)


def test_names_that_do_not_resolve_or_are_metadata_are_refused() -> None:
    def fails(host: str) -> list[str]:
        raise OSError("Name or service not known")
    with pytest.raises(UrlRefused, match="does not resolve"):
        check_url("https://nowhere.example/", allow_private=True, resolve=fails)
    with pytest.raises(UrlRefused, match="does not resolve"):
        check_url("https://empty.example/", allow_private=True, resolve=lambda host: [])
    with pytest.raises(UrlRefused, match="metadata"):
        check_url("http://metadata.google.internal./", allow_private=True,
                  resolve=lambda host: ["93.184.216.34"])


@pytest.mark.parametrize("url", ["ftp://example.com/", "http://user:pw@example.com/",
                                 "http:///nohost", "http://example.com:99999/",
                                 "http://[::1/", "x" * 2100])
def test_malformed_urls_are_refused(url: str) -> None:
    with pytest.raises(UrlRefused):
        check_url(url, allow_private=True, resolve=lambda host: ["93.184.216.34"])


def test_embedded_ipv4_forms() -> None:
    def v6(text: str) -> ipaddress.IPv6Address:
        return ipaddress.IPv6Address(text)
    assert embedded_ipv4(v6("2002:7f00:1::")) == (ipaddress.IPv4Address("127.0.0.1"),)
    assert embedded_ipv4(v6("::1")) == ()          # loopback itself, not 0.0.0.1
    assert embedded_ipv4(v6("::")) == ()
    assert embedded_ipv4(v6("2606:4700::1")) == ()
    assert embedded_ipv4(ipaddress.IPv4Address("127.0.0.1")) == ()


def test_the_addresses_a_connection_may_use_are_returned_parsed() -> None:
    checked = check_host_addresses("hooks.example", ["93.184.216.34"], allow_private=False)
    assert checked == [ipaddress.IPv4Address("93.184.216.34")]
    with pytest.raises(UrlRefused, match="not an IP address"):
        check_host_addresses("hooks.example", ["not-an-ip"], allow_private=True)
    assert address_refusal(ipaddress.ip_address("10.0.0.1"), allow_private=True) is None
