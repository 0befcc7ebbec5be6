"""Secrets encrypted at rest (Fernet: AES-128-CBC with an HMAC-SHA256 tag): endpoint signing secrets,
and the stored idempotent answers that carry a secret (intake/idempotency/store.py).

HERALD_ENCRYPTION_KEYS lists Fernet keys: the first encrypts, every one decrypts, so a key is
rotated by putting a new one first, running `manage.py reencrypt_secrets` (every stored secret is
re-encrypted under the first key) and then dropping the old one. Without it, one key is derived
from SECRET_KEY (HKDF-SHA256), which is why SECRET_KEY must then never change.
"""
from __future__ import annotations

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from webhooks.conf import herald_settings

__all__ = ["InvalidToken", "decrypt", "decrypt_bytes", "encrypt", "encrypt_bytes", "generate_key", "keys", "reencrypt",
           "reencrypt_bytes"]


def generate_key() -> str:
    """A new key for HERALD_ENCRYPTION_KEYS."""
    return Fernet.generate_key().decode("ascii")


def derived_key(secret_key: str) -> str:
    """The key used when HERALD_ENCRYPTION_KEYS is not set, derived from SECRET_KEY."""
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
               info=b"herald endpoint secrets").derive(secret_key.encode("utf-8"))
    return base64.urlsafe_b64encode(raw).decode("ascii")


def keys() -> list[str]:
    return list(herald_settings.secrets.HERALD_ENCRYPTION_KEYS) or [derived_key(settings.SECRET_KEY)]


@functools.lru_cache(maxsize=4)
def _fernet(configured: tuple[str, ...]) -> MultiFernet:
    try:
        return MultiFernet([Fernet(key) for key in configured])
    except ValueError as exc:
        raise ImproperlyConfigured(
            "HERALD_ENCRYPTION_KEYS must be comma-separated Fernet keys (32 url-safe base64-encoded bytes; "
            "make one with `python manage.py reencrypt_secrets --new-key`)") from exc


def _current() -> MultiFernet:
    return _fernet(tuple(keys()))


def encrypt(plaintext: str) -> str:
    return _current().encrypt(plaintext.encode("utf-8")).decode("ascii")


def decrypt(token: str) -> str:
    """The secret in `token`; InvalidToken if no configured key opens it."""
    return _decrypt(tuple(keys()), token)


@functools.lru_cache(maxsize=4096)
def _decrypt(configured: tuple[str, ...], token: str) -> str:
    # Every claim carries its endpoint's secrets: decrypted once per process, not once per attempt.
    return _fernet(configured).decrypt(token.encode("ascii")).decode("utf-8")


def forget() -> None:
    """Forget every decryption this process remembers (its endpoints' secrets: webhooks/delivery/destinations/access.py drops
    them once an endpoint is deleted or its access changed)."""
    _decrypt.cache_clear()


def reencrypt(token: str) -> str:
    """`token` encrypted under the first key (MultiFernet.rotate); InvalidToken if no key opens it."""
    return _current().rotate(token.encode("ascii")).decode("ascii")


def encrypt_bytes(plaintext: bytes) -> bytes:
    """`plaintext` as a Fernet token (ASCII bytes), under the first key."""
    return _current().encrypt(plaintext)


def decrypt_bytes(token: bytes) -> bytes:
    """What `encrypt_bytes` encrypted; InvalidToken if no configured key opens it."""
    return _current().decrypt(token)


def reencrypt_bytes(token: bytes) -> bytes:
    """`token` encrypted under the first key; InvalidToken if no key opens it."""
    return _current().rotate(token)
