"""The outbox's settings, read in one place: Django settings first, then the environment variables of the
same names (SPEC §13)."""
from __future__ import annotations

import os

from django.conf import settings


def setting(name: str, default: str = "") -> str:
    value = getattr(settings, name, None)
    if value is None or value == "":
        value = os.environ.get(name, default)
    return str(value)


def api_url() -> str:
    """`HERALD_API_URL`: Herald's base URL, e.g. `https://hooks.example.com`."""
    return setting("HERALD_API_URL", "http://127.0.0.1:8000")


def token() -> str:
    """`HERALD_TOKEN`: a tenant credential, or a platform credential to `publish(..., tenant=...)`."""
    value = setting("HERALD_TOKEN")
    if not value:
        raise RuntimeError("HERALD_TOKEN is not set (a Django setting or an environment variable)")
    return value
