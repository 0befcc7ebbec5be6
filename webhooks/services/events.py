"""Event intake's services: record an event (or a batch) and fan it out, send a test event, emit Herald's own.

The statements are the fan-out's, the owner of the event and delivery inserts (webhooks/delivery/fanout.py);
this is the name intake, the portal and the services call them by.
"""
from webhooks.delivery.fanout import (EventDataInvalid, event_emit_operational, event_ingest, event_ingest_many,
                                      event_send_test)

__all__ = ["EventDataInvalid", "event_emit_operational", "event_ingest", "event_ingest_many", "event_send_test"]
