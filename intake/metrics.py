"""HTTP-side metrics: responses by area and status, API write requests by idempotency outcome, calls
over the rate limit, requests the web worker refused while reading them."""
from prometheus_client import Counter, Gauge

import webhooks.delivery.metrics  # noqa: F401 - sets the multiprocess file naming before any metric exists

INTAKE_OUTCOMES = ("executed", "replayed", "mismatch", "in_progress", "released", "rejected")

intake_requests = Counter(
    "herald_intake_requests", "POST/PATCH requests under /api/v1/ by idempotency outcome", ["outcome"])

api_throttled = Counter(
    "herald_api_throttled", "API calls answered 429 because their credential was over INTAKE_RATE_LIMIT_PER_SECOND")
polls_refused = Counter(
    "herald_polls_refused",
    "Long-polls answered 429 too_many_waits, by the cap that was full (credential or endpoint)", ["cap"])
polls_parked = Gauge(
    "herald_polls_parked", "Long-polls waiting in the web workers' event loops (holding no thread)",
    multiprocess_mode="livesum")
http_refusals = Counter(
    "herald_http_refused",
    "Requests the web worker refused before any thread took them (408 too slow, 413 body too large, 431 head too large)",
    ["status"])
http_responses = Counter(
    "herald_http_responses", "Responses Django sent, by area (api, admin, portal, ops, other) and status code",
    ["area", "status"])

# By the first segment of the path (`api`: /api/v1/ and the schema and docs beside it); anything else
# (static files, unknown paths) is `other`, so the label has five values whatever clients ask for.
_AREAS = {"api": "api", "admin": "admin", "portal": "portal", "healthz": "ops", "metrics": "ops"}
for _area in {*_AREAS.values(), "other"}:
    http_responses.labels(_area, "500")  # at 0 from the start, so that rate() sees the first 500


def response_area(path: str) -> str:
    return _AREAS.get(path.lstrip("/").split("/", 1)[0], "other")


class ResponseMetricsMiddleware:
    """Counts every response by area and status (`herald_http_responses_total`). Outermost, so it sees
    the 500 Django makes of an exception raised anywhere inside, as the client does."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        http_responses.labels(response_area(request.path_info), str(response.status_code)).inc()
        return response
