"""For receivers: `verify(body, headers, secret)` checks a webhook Herald sent, with `standardwebhooks`
(`v1`, HMAC-SHA256, a `whsec_…` secret) or with `cryptography`'s ed25519 (`v1a`, a `whpk_…` public key:
the Standard Webhooks asymmetric scheme, which `standardwebhooks` does not verify; install the client
with its `ed25519` extra, `pip install "herald-client[ed25519]"`, for those).

    payload = verify(request.body, request.headers, "whsec_…")   # or "whpk_…"; raises WebhookVerificationError
    webhook_id = request.headers["webhook-id"]                    # de-duplicate on it

Verify the raw body bytes before parsing anything. Delivery is at least once, so a receiver
de-duplicates on `webhook-id` (the event id, the same on every retry and every endpoint). A server
verifying many requests makes one `WebhookVerifier(secret)` and calls its `verify(body, headers)`.
"""
from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook
from standardwebhooks.webhooks import WebhookVerificationError as _StandardVerificationError

from herald_client.errors import WebhookVerificationError
from herald_client.types import WebhookPayload

Secrets = str | bytes | Iterable[str]
PUBLIC_KEY_PREFIX = "whpk_"
TOLERANCE_SECONDS = 5 * 60  # as standardwebhooks: a timestamp further from now is a replay


class _PublicKeyWebhook:
    """Verifies `v1a` (ed25519) signatures under a `whpk_…` public key, as `standardwebhooks.Webhook` does
    `v1` ones: the same headers, the same five-minute tolerance, any one matching signature."""

    def __init__(self, public_key: str) -> None:
        try:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        except ImportError:
            raise ImportError('verifying a whpk_ public key (v1a) needs cryptography: '
                               'pip install "herald-client[ed25519]"') from None
        raw = base64.b64decode(public_key[len(PUBLIC_KEY_PREFIX):], validate=True)
        if len(raw) != 32:
            raise ValueError("an ed25519 public key is 32 bytes")
        self._key = Ed25519PublicKey.from_public_bytes(raw)

    def verify(self, data: bytes | str, headers: Mapping[str, str]) -> Any:
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        msg_id, timestamp, signatures = (headers.get(name) for name in
                                         ("webhook-id", "webhook-timestamp", "webhook-signature"))
        if not (msg_id and timestamp and signatures):
            raise _StandardVerificationError("Missing required headers")
        if not timestamp.isdigit():
            raise _StandardVerificationError("Invalid Signature Headers")
        if abs(time.time() - int(timestamp)) > TOLERANCE_SECONDS:
            raise _StandardVerificationError("Message timestamp too old or too new")
        signed = f"{msg_id}.{timestamp}.".encode() + body
        from cryptography.exceptions import InvalidSignature

        for versioned in signatures.split(" "):
            version, _, signature = versioned.partition(",")
            if version != "v1a":
                continue
            try:
                self._key.verify(base64.b64decode(signature, validate=True), signed)
            except (InvalidSignature, binascii.Error, ValueError):
                continue
            return json.loads(body.decode("utf-8"))
        raise _StandardVerificationError("No matching signature found")


class WebhookVerifier:
    """Verifies webhooks signed with `secret`: an endpoint's `whsec_…` (v1) or its `whpk_…` public key
    (v1a), or several of them (while you switch to a new one, any that verifies is enough). A malformed
    secret is a `ValueError` here, at once, not on the first request."""

    def __init__(self, secret: Secrets) -> None:
        secrets = [secret] if isinstance(secret, (str, bytes)) else list(secret)
        if not secrets:
            raise ValueError("no secret to verify with")
        try:
            self._webhooks = [_PublicKeyWebhook(one) if isinstance(one, str) and one.startswith(PUBLIC_KEY_PREFIX)
                              else Webhook(one) for one in secrets]
        except (ValueError, binascii.Error, RuntimeError, EmptyWebhookSecretError) as exc:
            raise ValueError(f"not a webhook secret (whsec_ or whpk_, and base64): {exc}") from None

    def verify(self, body: bytes | str, headers: Mapping[str, str]) -> WebhookPayload:
        """The webhook's payload (`{type, timestamp, data}`) if its signature verifies.

        `headers` is any mapping of the request's headers, names in any case (Django's
        `request.headers`, Flask's, a plain dict). Raises `WebhookVerificationError` when a `webhook-*`
        header is missing or malformed, no signature matches, `webhook-timestamp` is more than 5
        minutes from now (a replayed request), or the body is not a JSON object.
        """
        names = {str(name).lower(): str(value) for name, value in headers.items()}
        last: Exception | None = None
        for webhook in self._webhooks:
            try:
                payload = webhook.verify(body, names)
            except _StandardVerificationError as exc:
                last = exc
                continue
            except ValueError as exc:  # a garbled signature or timestamp, a body that is not UTF-8 or JSON
                raise WebhookVerificationError(f"malformed webhook: {exc}") from exc
            if not isinstance(payload, dict):
                raise WebhookVerificationError("the webhook's body is not a JSON object")
            return cast(WebhookPayload, payload)
        raise WebhookVerificationError(str(last)) from last


def verify(body: bytes | str, headers: Mapping[str, str], secret: Secrets) -> WebhookPayload:
    """`WebhookVerifier(secret).verify(body, headers)`: the payload of a webhook that verifies under
    `secret` (`whsec_…`, or a v1a endpoint's `whpk_…` public key), else `WebhookVerificationError`. Herald
    signs with every active secret of the endpoint, so during the 24 hours after a rotation either the old
    or the new one verifies."""
    return WebhookVerifier(secret).verify(body, headers)
