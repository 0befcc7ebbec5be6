"""The session cookie is `Secure` on a request that came over https (behind a proxy that says so through
SECURE_PROXY_SSL_HEADER), and stays usable over plain http for a local run; the portal's framing headers
and cookies (portal/framing.py)."""
from django.conf import settings

from portal import framing

PORTAL_PREFIX = "/portal/"


def secure_session_cookie_on_https(get_response):
    def middleware(request):
        response = get_response(request)
        cookie = response.cookies.get(settings.SESSION_COOKIE_NAME)
        if cookie is not None and request.is_secure():
            cookie["secure"] = True
        return response

    return middleware


def portal_framing(get_response):
    """The portal's X-Frame-Options (portal/framing.py; its CSP frame-ancestors is set with the rest of its
    policy, config/browser_headers.py); when it may be framed, its cookies (session, CSRF) are
    `SameSite=None; Secure` so that they reach it inside another site's page. Only under /portal/: the
    admin is never framed."""
    cookie_names = (settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME)

    def middleware(request):
        response = get_response(request)
        if not request.path_info.startswith(PORTAL_PREFIX):
            return response
        refused = framing.x_frame_options()
        if refused is None:
            del response["X-Frame-Options"]
            for name in cookie_names:
                cookie = response.cookies.get(name)
                if cookie is not None:
                    cookie["samesite"] = "None"
                    cookie["secure"] = True
        else:
            response["X-Frame-Options"] = refused
        return response

    return middleware
