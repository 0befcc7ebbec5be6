"""Intake metrics: one counter of API write requests by idempotency outcome."""
from prometheus_client import Counter

import webhooks.metrics  # noqa: F401 - sets the multiprocess file naming before any metric exists

INTAKE_OUTCOMES = ("executed", "replayed", "mismatch", "in_progress", "released", "rejected")

intake_requests = Counter(
    "herald_intake_requests", "POST/PATCH requests under /api/v1/ by idempotency outcome", ["outcome"])
