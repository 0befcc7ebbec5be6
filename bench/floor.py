"""The intake floor: a bare DRF view doing only Herald's idempotency key statements.

It runs Herald's own read, claim and store (intake/idempotency/store.py), on the same table and
database, in the same server and on the same middleware chain as Herald's /api/v1/ (bench/wsgi.py
routes /floor/ to the API's handler), so the gap between it and `POST /api/v1/events` is exactly what
Herald adds around the key: a replay is the read; a first execution the read, then the claim and the
store in one transaction. (Earlier, the floor ran on Django's full chain, sessions, CSRF and the admin's
middleware included, while /api/v1/ had its lean chain: intake rows without `"chain": "api"` in
results.json come from then, and the report marks them.)
"""
import json
import os
import uuid

from django.db import transaction
from rest_framework.response import Response
from rest_framework.views import APIView

from bench.floor_tasks import floor_post
from intake.idempotency import store

BODY = b'{"ok":true}'


class FloorKeyView(APIView):
    authentication_classes: list = []
    permission_classes: list = []

    def post(self, request):
        key = store.Key(credential_id=int(os.environ["BENCH_FLOOR_CREDENTIAL_ID"]),
                        key=request.META["HTTP_IDEMPOTENCY_KEY"], fingerprint="0" * 64)
        if store.key_read(key) is None:
            with store.key_transaction():
                store.key_claim(key)
                store.key_store(key, method="POST", path="/floor/events", status=202, headers=[], body=BODY,
                                encrypt=False, retention_seconds=86400, replace_expired=False, commit=True)
        return Response({"ok": True}, status=202)


class PlainSenderView(APIView):
    """The plain sender that `sustained` measures Herald against (issue 35 item 3): what a platform writes by
    hand with DRF and Celery. The same key bookkeeping as FloorKeyView, the event read from the JSON body, and
    one Celery task per event enqueued on commit (`transaction.on_commit`), which POSTs it to the receiver
    (bench/floor_tasks.py's floor_post: libcurl, kept alive, no signature, no record, no retry). Answers 202
    with the event's id, which the task sends as webhook-id, as Herald does; a replay answers the stored body.
    No event row, no authentication: what it leaves out is what Herald adds."""
    authentication_classes: list = []
    permission_classes: list = []

    def post(self, request):
        key = store.Key(credential_id=int(os.environ["BENCH_FLOOR_CREDENTIAL_ID"]),
                        key=request.META["HTTP_IDEMPOTENCY_KEY"], fingerprint="0" * 64)
        existing = store.key_read(key)
        if existing is not None and not existing.expired:
            return Response(json.loads(existing.response_body), status=existing.response_status)
        event = request.data
        event_id = f"msg_{uuid.uuid4().hex}"
        body = json.dumps({"id": event_id, "type": event.get("type")}).encode()
        url = os.environ["BENCH_SENDER_RECEIVER_URL"]
        with store.key_transaction():
            answered = store.key_claim(key)  # another request with this key finished while this one waited
            if answered is not None:
                return Response(json.loads(answered.response_body), status=answered.response_status)
            transaction.on_commit(lambda: floor_post.delay(event_id, url))
            store.key_store(key, method="POST", path="/floor/send", status=202, headers=[], body=body,
                            encrypt=False, retention_seconds=86400, replace_expired=existing is not None, commit=True)
        return Response(json.loads(body), status=202)
