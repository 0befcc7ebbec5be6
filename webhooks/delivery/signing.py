"""Standard Webhooks signing: secrets, v1 HMAC-SHA256 and v1a ed25519 signatures, and delivery headers.

A `v1` secret is `whsec_` + base64 of 32 random bytes; a `v1a` one is `whsk_` + base64 of the raw 32-byte
ed25519 private key, whose public half (`whpk_` + base64 of the raw 32-byte key) is all a receiver holds.
Both are stored and rotated alike (encrypted at rest, webhooks/crypto.py): which scheme signs follows
from the prefix, so an endpoint in its 24 h of rotation from one scheme to the other signs with both.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import functools
import secrets as _secrets
from collections.abc import Sequence

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
PRIVATE_KEY_PREFIX = "whsk_"
PUBLIC_KEY_PREFIX = "whpk_"
V1 = "v1"
V1A = "v1a"
SCHEMES = (V1, V1A)


def generate_secret() -> str:
    """Return a new random signing secret, ``whsec_`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def generate_signing_key(scheme: str = V1) -> str:
    """A new secret of `scheme`: a `whsec_` HMAC secret (v1) or a `whsk_` ed25519 private key (v1a)."""
    if scheme == V1:
        return generate_secret()
    if scheme == V1A:
        raw = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
        return PRIVATE_KEY_PREFIX + base64.b64encode(raw).decode("ascii")
    raise ValueError(f"unknown signature scheme {scheme!r}")


def scheme_of(secret: str) -> str:
    """`v1a` for a `whsk_` private key, else `v1`."""
    return V1A if secret.startswith(PRIVATE_KEY_PREFIX) else V1


@functools.lru_cache(maxsize=4096)
def _private_key(secret: str) -> Ed25519PrivateKey:
    # Loading the key is a third of a signature's cost: once per process and key, as crypto.decrypt is.
    raw = base64.b64decode(secret[len(PRIVATE_KEY_PREFIX):], validate=True)
    return Ed25519PrivateKey.from_private_bytes(raw)


def forget() -> None:
    """Forget every private key this process loaded (webhooks/delivery/destinations/access.py, with crypto.forget, once an endpoint
    is deleted or its tenant erased: no key of it may outlive it in a worker)."""
    _private_key.cache_clear()


def public_key(secret: str) -> str:
    """The `whpk_…` public key of a `whsk_…` private key: what `GET …/secret` shows for a v1a endpoint."""
    raw = _private_key(secret).public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PUBLIC_KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def _secret_key(secret: str) -> bytes:
    raw = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    # Tolerate unpadded base64 the way the reference libraries do (extra padding is ignored).
    key = base64.b64decode(raw + "==")
    if not key:
        raise ValueError("webhook secret may not be empty")
    return key


def sign(*, secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Return the ``v1,<base64>`` signature of ``{msg_id}.{timestamp}.{body}`` under ``secret``, or the
    ``v1a,<base64>`` ed25519 one when ``secret`` is a ``whsk_`` private key."""
    to_sign = f"{msg_id}.{int(timestamp)}.".encode() + body
    if secret.startswith(PRIVATE_KEY_PREFIX):
        return "v1a," + base64.b64encode(_private_key(secret).sign(to_sign)).decode("ascii")
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
