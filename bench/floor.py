"""The intake floor: a bare DRF view doing only Herald's idempotency key statements.

It runs Herald's own read, claim and store (intake/idempotency/store.py), on the same table and
database, in the same server and on the same middleware chain as Herald's /api/v1/ (bench/wsgi.py
routes /floor/ to the API's handler), so the gap between it and `POST /api/v1/events` is exactly what
Herald adds around the key: a replay is the read; a first execution the read, then the claim and the
store in one transaction. (Earlier, the floor ran on Django's full chain, sessions, CSRF and the admin's
middleware included, while /api/v1/ had its lean chain: intake rows without `"chain": "api"` in
results.json come from then, and the report marks them.)
"""
import os

from rest_framework.response import Response
from rest_framework.views import APIView

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
