"""What the portal's and the admin's pages tell the browser: `Cache-Control: no-store` (they show payloads,
receiver answers and secrets, which no shared or back-button cache should keep) and a strict Content
Security Policy.

The policy is built in one place, `content_security_policy(directives)`, from CONTENT_SECURITY_POLICY in
config/settings.py (scripts, styles and images from Herald itself only, no plugins, forms posted only to
Herald, never framed: `frame-ancestors 'none'`); `directives_for(request)` is where a page's directives
are chosen, so a setting that changes one (the portal's frame-ancestors) changes it there. The portal's
one `<style>` block carries the request's nonce (`request.csp_nonce`). The API and its docs pages are left
alone: the API answers JSON, and the docs pages run their own inline scripts.
"""
from __future__ import annotations

import secrets
from collections.abc import Mapping

from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from config.middleware import API_PREFIX
from portal import framing

# Pages whose answers get the headers: the portal's and the admin's (URL namespaces of config/urls.py).
NAMESPACES = ("portal", "admin")


def content_security_policy(directives: Mapping[str, str]) -> str:
    """A Content-Security-Policy header value: `name value; name value`, in the order given."""
    for name, value in directives.items():
        if not name or any(c in name + value for c in ";,\r\n"):
            raise ValueError(f"a CSP directive cannot hold ';', ',' or a line break: {name!r} {value!r}")
    return "; ".join(f"{name} {value}".strip() for name, value in directives.items())


def directives_for(request: HttpRequest) -> dict[str, str]:
    """The CSP directives of this request's page: the settings' policy, with the request's style nonce; on
    the portal's pages, the frame-ancestors of HERALD_PORTAL_FRAME_ANCESTORS (portal/framing.py) and the
    session's theme logo (an https URL the API checked) among the images."""
    directives = dict(settings.CONTENT_SECURITY_POLICY)
    directives["style-src"] = f"{directives.get('style-src', '')} 'nonce-{request.csp_nonce}'".strip()
    if request.path_info.startswith("/portal/"):
        directives["frame-ancestors"] = framing.frame_ancestors_source()
        logo = (getattr(request, "portal_theme", None) or {}).get("logo_url")
        if logo:
            directives["img-src"] = f"{directives.get('img-src', '')} {_image_origin(logo)}".strip()
    return directives


def _image_origin(url: str) -> str:
    """`https://host[:port]` of an image URL, for img-src ("" when it is not a plain https host)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return ""
    host = parts.hostname or ""
    if parts.scheme != "https" or not host or any(c not in "abcdefghijklmnopqrstuvwxyz0123456789.-" for c in host):
        return ""
    return f"https://{host}" + (f":{port}" if port else "")


def _browser_page(request: HttpRequest) -> bool:
    match = getattr(request, "resolver_match", None)
    if match is not None:
        return bool(set(match.namespaces) & set(NAMESPACES))
    return request.path_info.startswith(tuple(f"/{namespace}/" for namespace in NAMESPACES))


def browser_page_headers(get_response):
    """Middleware: the two headers on every portal and admin answer, redirects and error pages included."""

    def middleware(request: HttpRequest) -> HttpResponse:
        if request.path_info.startswith(API_PREFIX):  # (the web process's API chain leaves this out anyway)
            return get_response(request)
        request.csp_nonce = secrets.token_urlsafe(16)  # for the page's <style nonce="…">
        response = get_response(request)
        if _browser_page(request):
            if "no-store" not in response.get("Cache-Control", ""):
                response["Cache-Control"] = "no-store"
            response["Content-Security-Policy"] = content_security_policy(directives_for(request))
        return response

    return middleware
