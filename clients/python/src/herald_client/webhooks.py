"""For receivers: `verify(body, headers, secret)` checks a webhook Herald sent, with `standardwebhooks`.

    payload = verify(request.body, request.headers, "whsec_…")   # raises WebhookVerificationError
    webhook_id = request.headers["webhook-id"]                    # de-duplicate on it

Verify the raw body bytes before parsing anything. Delivery is at least once, so a receiver
de-duplicates on `webhook-id` (the event id, the same on every retry and every endpoint). A server
verifying many requests makes one `WebhookVerifier(secret)` and calls its `verify(body, headers)`.
"""
from __future__ import annotations

import binascii
from collections.abc import Iterable, Mapping
from typing import cast

from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook
from standardwebhooks.webhooks import WebhookVerificationError as _StandardVerificationError

from herald_client.errors import WebhookVerificationError
from herald_client.types import WebhookPayload

Secrets = str | bytes | Iterable[str]


class WebhookVerifier:
    """Verifies webhooks signed with `secret`: an endpoint's `whsec_…`, or several of them (while you
    switch to a new one, any that verifies is enough). A malformed secret is a `ValueError` here, at
    once, not on the first request."""

    def __init__(self, secret: Secrets) -> None:
        secrets = [secret] if isinstance(secret, (str, bytes)) else list(secret)
        if not secrets:
            raise ValueError("no secret to verify with")
        try:
            self._webhooks = [Webhook(one) for one in secrets]
        except (ValueError, binascii.Error, RuntimeError, EmptyWebhookSecretError) as exc:
            raise ValueError(f"not a webhook secret (whsec_ and base64): {exc}") from None

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
    `secret`, else `WebhookVerificationError`. Herald signs with every active secret of the endpoint,
    so during the 24 hours after a rotation either the old or the new one verifies."""
    return WebhookVerifier(secret).verify(body, headers)
