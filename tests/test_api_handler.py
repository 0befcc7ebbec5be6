"""The web process's WSGI application (config/api_handler.py): /api/v1/ on a middleware chain without the
browser-only middleware, answering with the same headers; everything else on Django's usual chain."""
import io
import json
import uuid

import pytest
from django.conf import settings

from config.api_handler import BROWSER_ONLY_MIDDLEWARE, Application, api_middleware
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


def _call(app, method: str, path: str, body: bytes = b"", headers: dict | None = None):
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
               "SERVER_NAME": "testserver", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
               "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body), "wsgi.errors": io.StringIO(),
               "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json"}
    environ.update({"HTTP_" + name.upper().replace("-", "_"): value for name, value in (headers or {}).items()})
    seen = {}

    def start_response(status, response_headers, exc_info=None):
        seen["status"], seen["headers"] = int(status.split()[0]), response_headers

    content = b"".join(app(environ, start_response))
    return seen["status"], {name.lower(): value for name, value in seen["headers"]}, content


def test_the_api_chain_is_the_full_one_without_the_browser_only_middleware():
    assert BROWSER_ONLY_MIDDLEWARE <= set(settings.MIDDLEWARE)  # each name is one that is configured
    assert api_middleware() == [path for path in settings.MIDDLEWARE if path not in BROWSER_ONLY_MIDDLEWARE]
    assert api_middleware()[-1] == "intake.idempotency.middleware.IdempotencyMiddleware"  # still innermost
    before = list(settings.MIDDLEWARE)
    app = Application()
    assert list(settings.MIDDLEWARE) == before  # put back after the API's chain is built
    # CSRF's view hook is in the site's chain only: an API call never runs it
    site_hooks = {hook.__self__.__class__.__name__ for hook in app.site._view_middleware}
    api_hooks = {hook.__self__.__class__.__name__ for hook in app.api._view_middleware}
    assert "CsrfViewMiddleware" in site_hooks and "CsrfViewMiddleware" not in api_hooks


def test_an_api_call_through_either_chain_gets_the_same_answer_and_headers(api):
    app = Application()
    body = json.dumps({"type": "invoice.paid", "data": {"invoice": "in_1"}}).encode()
    answers = []
    for handler in (app.site, app):  # Django's usual chain, then the application's route to the API's
        key = f"handler-{uuid.uuid4()}"
        headers = {"Authorization": f"Bearer {api.token}", "Idempotency-Key": key}
        status, response_headers, content = _call(handler, "POST", "/api/v1/events", body, headers)
        replay = _call(handler, "POST", "/api/v1/events", body, headers)
        answers.append((status, response_headers, content, replay))
    (site_status, site_headers, _, site_replay), (api_status, api_headers, _, api_replay) = answers
    assert site_status == api_status == 202 and site_replay[0] == api_replay[0] == 202
    varying = {"location", "x-request-id", "content-length"}
    assert {k: v for k, v in site_headers.items() if k not in varying} == \
        {k: v for k, v in api_headers.items() if k not in varying}
    assert api_headers["x-frame-options"] == "DENY" and api_headers["x-content-type-options"] == "nosniff"
    assert int(api_headers["content-length"]) > 0 and "set-cookie" not in api_headers
    assert api_replay[1]["idempotent-replay"] == "true" and api_replay[2] == answers[1][2]
    assert Event.objects.count() == 2


def test_the_browser_pages_still_take_the_full_chain(api):
    status, headers, _ = _call(Application(), "GET", "/admin/login/")
    assert status == 200 and "csrftoken=" in headers.get("set-cookie", "")  # CSRF's cookie: the site's chain
