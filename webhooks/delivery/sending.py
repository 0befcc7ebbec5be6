"""One attempt's request: its signed headers, then what its destination's kind sends (webhooks/delivery/destinations/).

No table of its own: what an attempt needs comes with its claim (webhooks/delivery/claim.py), and its result
goes to the record (webhooks/delivery/record.py). A threaded worker's engine (webhooks/delivery/engine.py)
sends many HTTP attempts at once with `attempt_open` and broker batches on its broker threads with
`broker_batch`; `attempt_send` sends one attempt of any kind on the calling thread.
"""
import time

from webhooks import tracing
from webhooks.conf import herald_settings
from webhooks.delivery import signing
from webhooks.delivery.claim import Claim
from webhooks.delivery.destinations import brokers, http
from webhooks.delivery.destinations.kinds import BROKERS
from webhooks.delivery.destinations import access as access_mod
from webhooks.delivery.destinations import http_transport as transport
from webhooks.delivery.destinations.base import AttemptResult


def attempt_headers(claim: Claim) -> dict[str, str]:
    """The signed headers of one attempt (its own timestamp; one signature per active secret)."""
    return message_headers(secrets=claim.secrets, event_id=claim.event_id, payload=claim.payload)


def message_headers(*, secrets: list[str], event_id: str, payload: bytes) -> dict[str, str]:
    """The Standard Webhooks headers a message carries now: sent with an attempt, or served to a poll
    endpoint's consumer (webhooks/services/polling.py)."""
    return signing.webhook_headers(secrets=secrets, msg_id=event_id, timestamp=int(time.time()),
                                   body=payload, user_agent=f"Herald/{herald_settings.delivery.version}")


def attempt_prepare(claim: Claim, *, timeout: float | None = None) -> access_mod.Prepared:
    """What the claim's HTTP attempt sends with: its signed headers, the endpoint's access (a token fetched if
    need be) and the proxy's route; blocks for a token fetch or a proxied host's lookup (see
    access_mod.needs_thread)."""
    return http.prepare(url=claim.url, headers=attempt_headers(claim), access=claim.access,
                        timeout=herald_settings.delivery.WEBHOOK_TIMEOUT_SECONDS if timeout is None else timeout)


def attempt_failed_early(prepared: access_mod.Prepared) -> AttemptResult:
    """The result of an attempt that failed before sending (no token, the proxied host refused)."""
    return http.failed_early(prepared)


def attempt_open(curl, claim: Claim, prepared: access_mod.Prepared) -> transport.Attempt:
    """The claim's HTTP attempt, set up on `curl` (see transport.Attempt)."""
    return http.open(curl, url=claim.url, body=claim.payload, prepared=prepared)


def broker_message(claim: Claim, headers: dict[str, str] | None = None) -> brokers.Message:
    """The claim's attempt as a broker message: the webhook's bytes and its signed headers."""
    return brokers.Message(claim.delivery_id, attempt_headers(claim) if headers is None else headers, claim.payload)


def broker_send(claims: list[Claim], messages: list[brokers.Message]) -> list[AttemptResult]:
    """One batch of broker attempts (claims of one endpoint) on this thread, within WEBHOOK_TIMEOUT_SECONDS."""
    target = claims[0].access.target
    return brokers.send(BROKERS[target.kind], target, messages,
                        timeout=herald_settings.delivery.WEBHOOK_TIMEOUT_SECONDS,
                        allow_private=herald_settings.delivery.WEBHOOK_ALLOW_PRIVATE_NETWORKS)


def attempt_send(claim: Claim, *, trace: tracing.DeliveryTrace | None = None) -> AttemptResult:
    """Prepare and send the claim's attempt on this thread, within WEBHOOK_TIMEOUT_SECONDS in all; with a
    trace, its attempt span starts before sending (adding the traceparent header) and ends with the result."""
    if claim.kind in BROKERS:
        headers = attempt_headers(claim)
        if trace is not None:
            trace.attempt_started(headers)
        (result,) = broker_send([claim], [broker_message(claim, headers)])
    else:
        prepared = attempt_prepare(claim)
        if trace is not None:
            trace.attempt_started(prepared.headers)  # adds the attempt's traceparent
        result = http.send(url=claim.url, body=claim.payload, prepared=prepared, access=claim.access)
    if trace is not None:
        trace.attempt_finished(result)
    return result
