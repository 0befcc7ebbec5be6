"""Who is at the other end of a request when proxies stand in between: the address admin login throttling
(django-axes, AXES_CLIENT_IP_CALLABLE in config/settings.py) counts failures against.

The rule is Rails' `remote_ip`: proxies of your own sit on loopback or private addresses, and each appends
the address it was reached from to `X-Forwarded-For` (compose's nginx does). So when the request came from
such a proxy, the client is the right-most address in that header that is not one of them, whatever a
client wrote further left; when it came from a public address, the header is the client's own say and is
ignored. Behind proxies on loopback or private addresses only (every address private), the left-most one
is the best guess there is.
"""
import ipaddress

from django.http import HttpRequest


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip().removeprefix("[").split("]")[0])
    except ValueError:
        return None


def _ours(address) -> bool:
    """A proxy of the deployment's own: loopback, private, link-local (never a client on the internet)."""
    return not address.is_global


def client_address(request: HttpRequest) -> str | None:
    """The client's IP address as text (None if even the peer's is missing)."""
    peer = _address(request.META.get("REMOTE_ADDR", ""))
    if peer is None:
        return None
    if not _ours(peer):
        return str(peer)
    hops = [_address(part) for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    client = peer
    for hop in reversed(hops):
        if hop is None:  # garbage: nothing to its left can be believed
            break
        client = hop
        if not _ours(hop):
            break
    return str(client)
