"""Standard Webhooks signing: secrets, v1 HMAC-SHA256 signatures and delivery headers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets as _secrets
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def generate_secret() -> str:
    """Return a new random signing secret, ``whsec_`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def _secret_key(secret: str) -> bytes:
    raw = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    # Tolerate unpadded base64 the way the reference libraries do (extra padding is ignored).
    key = base64.b64decode(raw + "==")
    if not key:
        raise ValueError("webhook secret may not be empty")
    return key


def sign(*, secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Return the ``v1,<base64>`` signature of ``{msg_id}.{timestamp}.{body}`` under ``secret``."""
    to_sign = f"{msg_id}.{int(timestamp)}.".encode() + body
    digest = hmac.new(_secret_key(secret), to_sign, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_header(*, secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """Return the ``webhook-signature`` value: one space-separated signature per secret."""
    if isinstance(secrets, str):  # a bare str is a Sequence[str] of characters: refuse it
        raise TypeError("secrets must be a sequence of secrets, not a single string")
    if not secrets:
        raise ValueError("at least one secret is required")
    return " ".join(sign(secret=s, msg_id=msg_id, timestamp=timestamp, body=body) for s in secrets)


def webhook_headers(
    *,
    secrets: Sequence[str],
    msg_id: str,
    timestamp: int,
    body: bytes,
    user_agent: str,
) -> dict[str, str]:
    """Return the HTTP headers of one signed delivery attempt."""
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": signature_header(
            secrets=secrets, msg_id=msg_id, timestamp=timestamp, body=body
        ),
        "user-agent": user_agent,
    }
