"""Whether the portal may be framed, and by whom (SPEC §15): HERALD_PORTAL_FRAME_ANCESTORS, read here only.

The portal's Content-Security-Policy (config/browser_headers.py) takes its `frame-ancestors` from
`frame_ancestors_source()`. Without the setting nothing may frame the portal (`frame-ancestors 'none'`
and `X-Frame-Options: DENY`); with it, only those origins (X-Frame-Options cannot name several origins,
so it is left out and browsers follow the CSP), and the portal's cookies become `SameSite=None; Secure`,
the only cookies a browser sends to a framed third-party page (portal/middleware.py).
"""
from webhooks.conf import herald_settings


def frame_ancestors() -> list[str]:
    """The origins that may frame the portal ([]: none may)."""
    return list(herald_settings.portal.HERALD_PORTAL_FRAME_ANCESTORS)


def frame_ancestors_source() -> str:
    """The value of the portal's CSP `frame-ancestors`: `'none'`, or the origins."""
    return " ".join(frame_ancestors()) or "'none'"


def x_frame_options() -> str | None:
    """The portal's X-Frame-Options: DENY, or none when some origins may frame it."""
    return None if frame_ancestors() else "DENY"
