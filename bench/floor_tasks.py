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


def _prepare(curl, delivery_id: str, url: str) -> None:
    """One floor POST: the body, the webhook-id, a 15 s deadline, the answer dropped."""
    curl.setopt(pycurl.URL, url)
    curl.setopt(pycurl.POSTFIELDS, BODY)
    curl.setopt(pycurl.HTTPHEADER, ["content-type: application/json", f"webhook-id: {delivery_id}", "Expect:"])
    curl.setopt(pycurl.NOSIGNAL, 1)
    curl.setopt(pycurl.TIMEOUT_MS, 15000)
    curl.setopt(pycurl.WRITEFUNCTION, lambda chunk: None)


@shared_task(name="bench.floor_post", ignore_result=True)
def floor_post(delivery_id: str, url: str) -> None:
    curl = getattr(_local, "curl", None)
    if curl is None:
        curl = _local.curl = pycurl.Curl()
    _prepare(curl, delivery_id, url)
    curl.perform()


@shared_task(name="bench.floor_post_many", ignore_result=True)
def floor_post_many(delivery_ids: list[str], url: str) -> None:
    """The floor on Herald's terms: one message carries up to 100 POSTs, as Herald's relay publishes up to 100
    ids per message, and they go out at once on libcurl's multi interface (kept-alive handles per thread), as
    Herald's engine sends them. Still no database, no signing, no record."""
    multi = getattr(_local, "multi", None)
    if multi is None:
        multi = _local.multi = pycurl.CurlMulti()
        _local.handles = []
    handles = _local.handles
    while len(handles) < len(delivery_ids):
        handles.append(pycurl.Curl())
    used = handles[:len(delivery_ids)]
    for curl, delivery_id in zip(used, delivery_ids):
        _prepare(curl, delivery_id, url)
        multi.add_handle(curl)
    try:
        running = len(used)
        while running:
            status, running = multi.perform()
            if status == pycurl.E_CALL_MULTI_PERFORM:
                continue
            if running:
                multi.select(1.0)
        _, _, failed = multi.info_read()
    finally:
        for curl in used:
            multi.remove_handle(curl)
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(used)} floor POSTs failed: {failed[0][2]}")


@shared_task(name="bench.floor_post_requests", ignore_result=True)
def floor_post_requests(delivery_id: str, url: str) -> None:
    """The same POST with requests (one session per thread), for the pool comparison."""
    import requests

    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
    session.post(url, data=BODY, headers={"content-type": "application/json", "webhook-id": delivery_id},
                 timeout=15).close()
