"""URLs as they may be shown where secrets must not go (logs, trace spans, the admin's history).

- An endpoint's URL: scheme, host, port and path only (`url_without_secrets`). Receivers put tokens in
  the query, and credentials in the user info.
- Herald's own paths: a portal link's token (`/portal/open/<token>`) opens the tenant's portal for whoever
  reads it first, so it is masked wherever a path is written down (`mask_secrets`): logs (config/logmask.py),
  gunicorn's access log, trace spans (webhooks/tracing.py); compose's nginx applies the same pattern.
"""
import re
from urllib.parse import urlsplit

MASK = "***"
# The token runs to the next path separator, query, fragment, quote or space (a log line may quote the
# path, or hold it in a repr).
_PORTAL_TOKEN = re.compile(r"(/portal/open/)[^/?#\s\"'<>]+")


def mask_secrets(text: str) -> str:
    """`text` with every portal link token replaced by `***`."""
    if "/portal/open/" not in text:  # the common case: no regex work at all
        return text
    return _PORTAL_TOKEN.sub(r"\1" + MASK, text)


def url_without_secrets(url: str) -> str:
    """`url` without user info, query or fragment ("" if it is no URL at all)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return ""
    if host is None:
        return ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}{parts.path}"
