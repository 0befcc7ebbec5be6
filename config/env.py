"""Typed readers for the environment variables of SPEC §1, each with a working local default."""
import os
import re
from urllib.parse import urlsplit


def env_str(name: str, default: str) -> str:
    value = os.environ.get(name)
    return default if value is None or value == "" else value


def env_int(name: str, default: int) -> int:
    return int(env_str(name, str(default)))


def env_float(name: str, default: float) -> float:
    return float(env_str(name, str(default)))


def env_bool(name: str, default: bool) -> bool:
    value = env_str(name, "true" if default else "false").strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name} must be true or false, not {value!r}")


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


def env_origin(name: str) -> str:
    """An origin (`scheme://host[:port]`, lower-cased, no trailing slash), or "" when unset.

    Only http(s), a host and an optional port: a path, query, fragment or user name is refused, so a typo
    cannot quietly produce links and trusted origins that are not where users reach Herald.
    """
    value = env_str(name, "").strip()
    if not value:
        return ""
    return _origin(name, value)


def env_origins(name: str) -> list[str]:
    """Space-separated origins (each as `env_origin` takes it), or [] when unset."""
    return [_origin(name, value) for value in env_str(name, "").split()]


def _origin(name: str, value: str) -> str:
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{name} is not a URL: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{name} must be http(s)://host[:port], not {value!r}")
    if parts.username is not None:
        raise ValueError(f"{name} must not carry a user name or password")
    if not re.fullmatch(r"[A-Za-z0-9.-]+|[0-9A-Fa-f:.]+", parts.hostname):
        # (it goes into headers: Content-Security-Policy, for HERALD_PORTAL_FRAME_ANCESTORS)
        raise ValueError(f"{name}: {parts.hostname!r} is not a host name or address")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{name} must be only http(s)://host[:port] (no path or query), not {value!r}")
    scheme = parts.scheme.lower()
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    # As browsers send it in `Origin`: the scheme's own port is left out.
    shown_port = "" if port is None or port == {"http": 80, "https": 443}[scheme] else f":{port}"
    return f"{scheme}://{host}{shown_port}"
