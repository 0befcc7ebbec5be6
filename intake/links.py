"""The address of a portal link: on HERALD_PUBLIC_URL when it is set (where users reach Herald, through
the proxy in front), else on the host and scheme the request itself came in on (a local run)."""
from django.conf import settings
from django.http import HttpRequest
from django.urls import reverse


def portal_link_url(request: HttpRequest, token: str) -> str:
    """The full URL that opens the portal with `token` (made by webhooks.services.portal)."""
    path = reverse("portal:open", args=[token])
    if settings.HERALD_PUBLIC_URL:
        return settings.HERALD_PUBLIC_URL + path
    return request.build_absolute_uri(path)
