"""The web process's WSGI application: REST API calls (/api/v1/) take a middleware chain of their own.

Every request used to go through all of MIDDLEWARE, though an API call carries a bearer token and never
uses what the browser pages need: static files (whitenoise), the session cookie's Secure flag, sessions,
CSRF (every API view is a DRF view, which is CSRF-exempt), the admin's user and messages, and the admin
login lockout (axes). `/api/v1/` goes to a second Django handler built from MIDDLEWARE without those,
in the same order, so the API keeps everything else as it was: the metrics, the request id, the NUL
guard, the security and frame headers, CommonMiddleware (Content-Length), the rate limit and the
idempotency layer, and any middleware added at start (OpenTelemetry's). Everything else goes to
Django's usual handler. Measured in docs/idempotency.md ("The hot path, measured").
"""
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler

from config.middleware import API_PREFIX
# Browser-only middleware: what an API call never needs (see the module doc).
BROWSER_ONLY_MIDDLEWARE = frozenset({
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "portal.middleware.secure_session_cookie_on_https",
    "portal.middleware.portal_framing",
    "config.middleware.BrowserSessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "config.middleware.BrowserAuthenticationMiddleware",
    "config.middleware.BrowserMessageMiddleware",
    "axes.middleware.AxesMiddleware",
    "config.browser_headers.browser_page_headers",
})


def api_middleware() -> list[str]:
    """MIDDLEWARE as the API's handler runs it."""
    return [path for path in settings.MIDDLEWARE if path not in BROWSER_ONLY_MIDDLEWARE]


class ApiWSGIHandler(WSGIHandler):
    """Django's WSGI handler over api_middleware()."""

    def load_middleware(self, is_async=False):
        # Django builds the chain from settings.MIDDLEWARE; it is swapped only while this handler is built,
        # once, at import of the WSGI module (one thread), and put back at once.
        full = settings.MIDDLEWARE
        settings.MIDDLEWARE = api_middleware()
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = full


class Application:
    """`/api/v1/…` to the API's handler, everything else to Django's usual one."""

    def __init__(self) -> None:
        self.site = WSGIHandler()
        self.api = ApiWSGIHandler()

    def __call__(self, environ, start_response):
        handler = self.api if environ.get("PATH_INFO", "").startswith(API_PREFIX) else self.site
        return handler(environ, start_response)
