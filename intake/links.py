"""The address of a portal link: on HERALD_PUBLIC_URL when it is set (where users reach Herald, through
the proxy in front), else on the host and scheme the request itself came in on (a local run)."""
from django.http import HttpRequest
from django.urls import reverse

from webhooks.conf import herald_settings


def portal_link_url(request: HttpRequest, token: str) -> str:
    """The full URL that opens the portal with `token` (made by webhooks.services.portal)."""
    path = reverse("portal:open", args=[token])
    if herald_settings.web.HERALD_PUBLIC_URL:
        return herald_settings.web.HERALD_PUBLIC_URL + path
    return request.build_absolute_uri(path)
