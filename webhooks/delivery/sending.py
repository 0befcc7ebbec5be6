"""One attempt's request: its signed headers, the endpoint's access, and libcurl set up to send it.

No table of its own: what an attempt needs comes with its claim (webhooks/delivery/leases.py), and its
result goes to the record (webhooks/recording.py). A threaded worker's engine (webhooks/engine.py) sends
many at once with `attempt_open`; `attempt_send` sends one on the calling thread.
"""
import time

import pycurl

from webhooks import access as access_mod
from webhooks import signing, tracing, transport
from webhooks.conf import herald_settings
from webhooks.delivery.leases import Claim


def attempt_headers(claim: Claim) -> dict[str, str]:
    """The signed headers of one attempt (its own timestamp; one signature per active secret)."""
    return message_headers(secrets=claim.secrets, event_id=claim.event_id, payload=claim.payload)


def message_headers(*, secrets: list[str], event_id: str, payload: bytes) -> dict[str, str]:
    """The Standard Webhooks headers a message carries now: sent with an attempt, or served to a poll
    endpoint's consumer (webhooks/services/polling.py)."""
    return signing.webhook_headers(secrets=secrets, msg_id=event_id, timestamp=int(time.time()),
                                   body=payload, user_agent=f"Herald/{herald_settings.delivery.version}")


def attempt_prepare(claim: Claim, *, timeout: float | None = None) -> access_mod.Prepared:
    """What the claim's attempt sends with: its signed headers, the endpoint's access (a token fetched if
    need be) and the proxy's route; blocks for a token fetch or a proxied host's lookup (see
    access_mod.needs_thread)."""
    return access_mod.prepare(url=claim.url, headers=attempt_headers(claim), access=claim.access,
                              timeout=herald_settings.delivery.WEBHOOK_TIMEOUT_SECONDS if timeout is None else timeout)


def attempt_failed_early(prepared: access_mod.Prepared) -> transport.AttemptResult:
    """The result of an attempt that failed before sending (no token, the proxied host refused)."""
    return transport.AttemptResult(status=None, body="", duration_ms=prepared.spent_ms, error=prepared.error,
                                   retry_after=None)


def attempt_open(curl, claim: Claim, prepared: access_mod.Prepared) -> transport.Attempt:
    """The claim's attempt, set up on `curl` (see transport.Attempt)."""
    return transport.Attempt(curl, url=claim.url, body=claim.payload, headers=prepared.headers,
                             timeout=prepared.timeout,
                             allow_private_networks=herald_settings.delivery.WEBHOOK_ALLOW_PRIVATE_NETWORKS,
                             auth=prepared.auth, client_cert=prepared.client_cert, route=prepared.route,
                             ca_file=herald_settings.delivery.WEBHOOK_CA_BUNDLE or None)


def attempt_send(claim: Claim, *, trace: tracing.DeliveryTrace | None = None) -> transport.AttemptResult:
    """Prepare and send the claim's attempt on this thread, within WEBHOOK_TIMEOUT_SECONDS in all; with a
    trace, its attempt span starts before sending (adding the traceparent header) and ends with the result."""
    prepared = attempt_prepare(claim)
    if trace is not None:
        trace.attempt_started(prepared.headers)  # adds the attempt's traceparent
    if prepared.error:
        result = attempt_failed_early(prepared)
    else:
        attempt = attempt_open(transport.thread_handle(), claim, prepared)
        try:
            attempt.curl.perform()
        except pycurl.error as exc:
            result = attempt.finish(exc.args[0], str(exc.args[1]))
        else:
            result = attempt.finish()
        access_mod.after_attempt(claim.access, prepared, result)
    if trace is not None:
        trace.attempt_finished(result)
    return result
