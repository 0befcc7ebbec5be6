"""The delivery floor: a bare Celery task (same app, same durability settings) that POSTs the body."""
import requests
from celery import shared_task

_session = None
BODY = b'{"type":"invoice.paid","timestamp":"2026-11-30T00:00:00.000000Z","data":{"invoice":"in_1","amount":1200}}'


@shared_task(name="bench.floor_post", ignore_result=True)
def floor_post(delivery_id: str, url: str) -> None:
    global _session
    if _session is None:
        _session = requests.Session()
    _session.post(url, data=BODY, headers={"content-type": "application/json", "webhook-id": delivery_id},
                  timeout=15, allow_redirects=False).close()
