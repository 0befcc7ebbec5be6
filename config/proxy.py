"""Who is at the other end of a request when proxies stand in between: the address admin login throttling
(django-axes, AXES_CLIENT_IP_CALLABLE in config/settings.py) counts failures against, and the one logs name.

`X-Forwarded-For` is believed only from the proxies the operator names (`HERALD_TRUSTED_PROXIES`, CIDRs;
compose names its own network): each of them appends the address it was reached from, so the client is
the right-most address in the header that is not one of them, whatever a client wrote further left. A
peer that is not a trusted proxy is the client itself, whatever it says, on a private network as on the
internet: anyone who can reach gunicorn directly could otherwise write any address they like and count
their failures against it. Behind trusted proxies only (every address trusted), the left-most one is the
best guess there is; a hop that is no address at all ends the walk (nothing to its left can be believed).
"""
import functools
import ipaddress

from django.http import HttpRequest

from webhooks.conf import herald_settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(cidrs) -> tuple[Network, ...]:
    """CIDRs (`10.0.0.0/8`, `127.0.0.1`, `fd00::/8`) as networks; ValueError names a bad one."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{cidr!r} is not an IP address or CIDR network") from None
    return tuple(networks)


@functools.lru_cache(maxsize=8)
def _trusted(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return parse_networks(cidrs)


def _address(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text.strip().removeprefix("[").split("]")[0])
    except ValueError:
        return None
    # an IPv4 client on a dual-stack socket (::ffff:192.0.2.1) is that IPv4 address
    return getattr(address, "ipv4_mapped", None) or address


def _is_trusted(address: Address, trusted: tuple[Network, ...]) -> bool:
    return any(address.version == network.version and address in network for network in trusted)


def client_address(request: HttpRequest) -> str | None:
    """The client's IP address as text (None if even the peer's is missing)."""
    peer = _address(request.META.get("REMOTE_ADDR", ""))
    if peer is None:
        return None
    trusted = _trusted(tuple(herald_settings.web.HERALD_TRUSTED_PROXIES))
    if not _is_trusted(peer, trusted):
        return str(peer)
    client = peer
    for part in reversed(request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")):
        hop = _address(part)
        if hop is None:  # garbage, or nothing at all: nothing to its left can be believed
            break
        client = hop
        if not _is_trusted(hop, trusted):
            break
    return str(client)
