"""Which resolved addresses hyocr may dial for image URLs and webhooks (docs/SECURITY.md, "Network").

Judged by the address alone, after resolution: public hosts, internal ones an operator may open
(``allow_private``), and those never dialled whatever the policy (cloud metadata, link-local, reserved).
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Ranges an operator may open with allow_private (internal image hosts). Everything else that is not
# globally routable (link-local incl. 169.254.169.254, 0.0.0.0/8, multicast, reserved, documentation,
# benchmarking, ...) is never dialled, whatever the policy says.
_INTERNAL = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7", "fec0::/10")
)
# Never dialled, whatever the policy: cloud metadata and host services that sit outside link-local, inside
# ranges an operator may open (Alibaba's 100.100.100.200 in CGNAT, AWS's IPv6 IMDS in ULA) or that an older
# Python calls global (192.0.0.0/24, global in 3.11 before 3.11.10: Oracle's 192.0.0.192), and Azure's
# WireServer (168.63.129.16, a public address).
_NEVER = tuple(
    ipaddress.ip_network(n)
    for n in ("192.0.0.0/24", "168.63.129.16/32", "100.100.100.200/32", "fd00:ec2::/32")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def address_class(ip: IPAddress) -> str:
    """``"public"``, ``"internal"`` (loopback, RFC 1918, CGNAT, ULA) or ``"never"``.

    IPv6 forms that carry an IPv4 address are judged by it: mapped and NAT64 (``::ffff:127.0.0.1`` is
    loopback) by the IPv4 address alone; tunnels (compatible, 6to4, Teredo) are public or never.
    ``is_global`` alone is not enough: Python calls ``::7f00:1``, ``2002:7f00:1::`` and ``fec0::1`` global.
    """
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded and (ip.ipv4_mapped is not None or ip in _NAT64):  # translations: the IPv4 decides
            return address_class(embedded[0])
        if embedded:  # tunnels lead elsewhere than an internal host: only public on both sides
            public = all(address_class(v4) == "public" for v4 in embedded)
            return "public" if public and ip.is_global and not ip.is_reserved else "never"
    if any(ip in net for net in _NEVER):
        return "never"
    if ip.is_loopback or any(ip in net for net in _INTERNAL):
        return "internal"
    bad = ip.is_unspecified or ip.is_multicast or ip.is_link_local or ip.is_reserved or ip.is_private
    return "public" if ip.is_global and not bad else "never"


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip in _NAT64:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    return []
