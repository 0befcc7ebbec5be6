"""The delivery floor: a bare Celery task (same app, pool, concurrency and durability settings) that POSTs the body.

It uses libcurl with one kept-alive handle per thread, as Herald's transport does, and nothing else:
no database, no signing, no record. What Herald adds on top of it is the claim, the signature, the
record and the hand-on.
"""
import threading

import pycurl
from celery import shared_task

BODY = b'{"type":"invoice.paid","timestamp":"2026-11-30T00:00:00.000000Z","data":{"invoice":"in_1","amount":1200}}'
_local = threading.local()


@shared_task(name="bench.floor_post", ignore_result=True)
def floor_post(delivery_id: str, url: str) -> None:
    curl = getattr(_local, "curl", None)
    if curl is None:
        curl = _local.curl = pycurl.Curl()
    curl.setopt(pycurl.URL, url)
    curl.setopt(pycurl.POSTFIELDS, BODY)
    curl.setopt(pycurl.HTTPHEADER, ["content-type: application/json", f"webhook-id: {delivery_id}", "Expect:"])
    curl.setopt(pycurl.NOSIGNAL, 1)
    curl.setopt(pycurl.TIMEOUT_MS, 15000)
    curl.setopt(pycurl.WRITEFUNCTION, lambda chunk: None)
    curl.perform()


@shared_task(name="bench.floor_post_requests", ignore_result=True)
def floor_post_requests(delivery_id: str, url: str) -> None:
    """The same POST with requests (one session per thread), for the pool comparison."""
    import requests

    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
    session.post(url, data=BODY, headers={"content-type": "application/json", "webhook-id": delivery_id},
                 timeout=15).close()
