"""The SSRF policy's addresses: which IPs Herald may connect to, and a host's lookup within a deadline.

Every destination checks the host it connects to here: HTTP at connect time (libcurl's
OPENSOCKETFUNCTION, webhooks/delivery/destinations/http_transport.py), a broker before it opens its
connection, to the address it checked (webhooks/delivery/destinations/brokers.py).
"""
from __future__ import annotations

import ipaddress
import socket
import threading
import time
from urllib.parse import urlsplit

# Ranges that ipaddress does not flag as non-global (or did not in every CPython 3.11
# patch release) but that must never be reachable from a webhook sender.
_BLOCKED_NETWORKS: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = tuple(
    ipaddress.ip_network(net)
    for net in (
        "100.64.0.0/10",  # CGNAT shared address space
        "192.0.0.0/24",  # IETF protocol assignments
        "192.88.99.0/24",  # 6to4 relay anycast
        "198.18.0.0/15",  # benchmarking
        "64:ff9b::/96",  # NAT64, embeds IPv4 addresses
        "64:ff9b:1::/48",  # local-use NAT64
        "2001:20::/28",  # ORCHIDv2
        "2002::/16",  # 6to4, embeds IPv4 addresses
        "5f00::/16",  # IPv6 segment routing
        "3fff::/20",  # documentation
        "fec0::/10",  # deprecated site-local
    )
)


def is_public_address(ip: str) -> bool:
    """True only for a globally routable unicast IP (never loopback, private, CGNAT, ...)."""
    try:
        addr = ipaddress.ip_address(ip.strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and (
        addr.ipv4_mapped is not None or addr.sixtofour is not None or addr.teredo is not None
    ):
        return False
    if (
        not addr.is_global
        or addr.is_private
        or addr.is_loopback
        or addr.is_link_local
        or addr.is_multicast
        or addr.is_reserved
        or addr.is_unspecified
    ):
        return False
    return not any(addr in net for net in _BLOCKED_NETWORKS)


# Lookups in flight at once for URL checks (each on a thread of its own, see _getaddrinfo_within).
_LOOKUPS = threading.BoundedSemaphore(8)


def _getaddrinfo_within(host: str, port: int, timeout: float) -> list:
    """getaddrinfo (the system's resolver: /etc/hosts, then DNS, as libcurl resolves at connect time), with a
    deadline of its own: the C call cannot be interrupted, so it runs on a daemon thread that is left to
    finish by itself when the deadline passes. At most 8 such threads exist at once, so a DNS server that
    never answers costs a few idle threads, never a request held past `timeout`."""
    deadline = time.monotonic() + timeout
    if not _LOOKUPS.acquire(timeout=timeout):
        raise TimeoutError
    outcome: dict = {}
    done = threading.Event()

    def lookup() -> None:
        try:
            outcome["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = exc
        finally:
            _LOOKUPS.release()
            done.set()

    threading.Thread(target=lookup, name="herald-url-check-dns", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        raise TimeoutError
    if "error" in outcome:
        raise outcome["error"]
    return outcome["infos"]


def resolve(host: str, port: int, timeout: float) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]  # a literal: no lookup
    except ValueError:
        pass
    try:
        infos = _getaddrinfo_within(host, port, timeout)
    except TimeoutError:
        raise ValueError(f"the DNS lookup of host {host!r} did not finish within {timeout:g} s") from None
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"cannot resolve host {host!r}: {exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


HTTP_PORTS = {"http": 80, "https": 443}


def check_url_host(url: str, *, dns_timeout: float = 2.0, ports: dict[str, int] = HTTP_PORTS) -> None:
    """Raise ValueError unless ``url``'s scheme is one of ``ports`` (http(s) unless told; the value is its
    default port) and its host resolves only to public addresses, within ``dns_timeout`` seconds."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"invalid URL {url!r}: {exc}") from None
    if parts.scheme not in ports:
        raise ValueError(f"URL scheme must be {' or '.join(ports)}, not {parts.scheme!r}")
    if not host:
        raise ValueError(f"URL {url!r} has no host")
    blocked = [ip for ip in resolve(host, port or ports[parts.scheme], dns_timeout) if not is_public_address(ip)]
    if blocked:
        raise ValueError(
            f"host {host!r} resolves to non-public address {blocked[0]}; "
            "webhook endpoints must be reachable on the public internet"
        )
