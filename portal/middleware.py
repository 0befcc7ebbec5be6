"""The session cookie is `Secure` on a request that came over https (behind a proxy that says so through
SECURE_PROXY_SSL_HEADER), and stays usable over plain http for a local run."""
from django.conf import settings


def secure_session_cookie_on_https(get_response):
    def middleware(request):
        response = get_response(request)
        cookie = response.cookies.get(settings.SESSION_COOKIE_NAME)
        if cookie is not None and request.is_secure():
            cookie["secure"] = True
        return response

    return middleware
