"""The request id of the work in hand, carried from an intake request to the deliveries it created."""
import contextvars
import logging
import re
import uuid

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("herald_request_id", default="")

_VALID = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")


def new_request_id(incoming: str | None = None) -> str:
    """Keep a sane client-supplied id (so traces join up), otherwise make one."""
    if incoming and _VALID.match(incoming):
        return incoming
    return f"req_{uuid.uuid4().hex}"


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every log record, so each JSON line can be joined to its request."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", None):
            record.request_id = request_id.get()
        return True
