"""Intake metrics: API write requests by idempotency outcome, calls over the rate limit, requests the
web worker refused while reading them."""
from prometheus_client import Counter

import webhooks.metrics  # noqa: F401 - sets the multiprocess file naming before any metric exists

INTAKE_OUTCOMES = ("executed", "replayed", "mismatch", "in_progress", "released", "rejected")

intake_requests = Counter(
    "herald_intake_requests", "POST/PATCH requests under /api/v1/ by idempotency outcome", ["outcome"])

api_throttled = Counter(
    "herald_api_throttled", "API calls answered 429 because their credential was over INTAKE_RATE_LIMIT_PER_SECOND")
http_refusals = Counter(
    "herald_http_refused",
    "Requests the web worker refused before any thread took them (408 too slow, 413 body too large, 431 head too large)",
    ["status"])
