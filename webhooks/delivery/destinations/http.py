"""The `http` destination (SPEC §6): a signed POST to the endpoint's URL, on libcurl.

- prepare: the endpoint's access (extra headers, basic/bearer auth or an OAuth2 token, the client certificate,
  the proxy's route: access.py); a token fetch or a proxied host's lookup blocks, so the engine prepares those
  on a thread of its own (`access.needs_thread`);
- send: `open` sets the attempt up on a libcurl handle (http_transport.Attempt: the whole-attempt deadline, the
  connect-time address check, the 4 KiB excerpt), which the engine drives on its multi handle; `send` performs
  one on the calling thread;
- classify: 2xx is delivered; 410 Gone disables the endpoint and fails the delivery at once; a Retry-After on
  429 or 503 holds the next attempt back (within the schedule's longest step); anything else is retried.
"""
from __future__ import annotations

import pycurl

from webhooks.conf import herald_settings
from webhooks.delivery.destinations import access as access_mod
from webhooks.delivery.destinations import http_transport as transport
from webhooks.delivery.destinations.base import AttemptResult, Verdict

kind = "http"
pushed = True


def prepare(*, url: str, headers: dict[str, str], access: access_mod.Access | None,
            timeout: float) -> access_mod.Prepared:
    """What the attempt sends with (see access_mod.prepare)."""
    return access_mod.prepare(url=url, headers=headers, access=access, timeout=timeout)


def failed_early(prepared: access_mod.Prepared) -> AttemptResult:
    """The result of an attempt that failed before sending (no token, the proxied host refused)."""
    return AttemptResult(status=None, body="", duration_ms=prepared.spent_ms, error=prepared.error, retry_after=None)


def open(curl, *, url: str, body: bytes, prepared: access_mod.Prepared) -> transport.Attempt:  # noqa: A001
    """The attempt, set up on `curl` (see transport.Attempt)."""
    return transport.Attempt(curl, url=url, body=body, headers=prepared.headers, timeout=prepared.timeout,
                             allow_private_networks=herald_settings.delivery.WEBHOOK_ALLOW_PRIVATE_NETWORKS,
                             auth=prepared.auth, client_cert=prepared.client_cert, route=prepared.route,
                             ca_file=herald_settings.delivery.WEBHOOK_CA_BUNDLE or None,
                             header_lines=prepared.header_lines)


def send(*, url: str, body: bytes, prepared: access_mod.Prepared, access: access_mod.Access | None) -> AttemptResult:
    """One prepared attempt performed on this thread's libcurl handle."""
    if prepared.error:
        return failed_early(prepared)
    attempt = open(transport.thread_handle(), url=url, body=body, prepared=prepared)
    try:
        attempt.curl.perform()
    except pycurl.error as exc:
        result = attempt.finish(exc.args[0], str(exc.args[1]))
    else:
        result = attempt.finish()
    access_mod.after_attempt(access, prepared, result)
    return result


def classify(result: AttemptResult) -> Verdict:
    if result.ok:
        return Verdict(ok=True)
    if result.status == 410:
        return Verdict(ok=False, gone=True)
    return Verdict(ok=False, retry_after=result.retry_after if result.status in (429, 503) else None)
