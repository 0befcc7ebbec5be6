"""Secrets that travel in a URL path never reach a log line: a portal link's token (`/portal/open/<token>`)
opens the tenant's portal for whoever reads it first, so access logs and Django's request warnings (a 405 or
a refused CSRF check on the link's page are logged while the link still works) show `/portal/open/***`.

One rule (webhooks/urltext.py, which trace spans use too), used by Django's log handler (LOGGING in
config/settings.py) and gunicorn's access log (`logger_class` in gunicorn.conf.py); compose's nginx applies
the same pattern in its log format (deploy/nginx/herald.conf.template).
"""
import logging

from django.http import HttpRequest

from webhooks.urltext import MASK, mask_secrets

__all__ = ["MASK", "MaskSecretsFilter", "mask_secrets"]


class MaskSecretsFilter(logging.Filter):
    """On a handler: the message (already formatted with its arguments) and any string or request passed as
    `extra` are masked before the formatter writes them. Django's request warnings pass the request itself
    (`extra={"request": …}`), which the JSON formatter would write out with its path."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed call: the handler reports it, never the caller
            return True
        masked = mask_secrets(message)
        if masked is not message:
            record.msg, record.args = masked, None
        for name, value in list(vars(record).items()):
            if name in ("msg", "args"):
                continue
            if isinstance(value, str):
                if "/portal/open/" in value:
                    setattr(record, name, mask_secrets(value))
            elif isinstance(value, HttpRequest):
                setattr(record, name, mask_secrets(repr(value)))
        return True

