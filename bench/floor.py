"""The intake floor: a bare DRF view doing only the idempotency key's INSERT … ON CONFLICT and UPDATE.

It runs Herald's own acquire statement, on the same table and database, in the same server, so the
gap between it and `POST /api/v1/events` is exactly what Herald adds around the key.
"""
import os

from django.db import connection
from rest_framework.response import Response
from rest_framework.views import APIView

from intake.idempotency import store

_COMPLETE_SQL = f"""
UPDATE {store._TABLE} SET status = 'completed', response_status = 202, response_headers = '[]'::jsonb,
       response_body = %s WHERE id = %s AND lock_token = %s
"""
BODY = b'{"ok":true}'


class FloorKeyView(APIView):
    authentication_classes: list = []
    permission_classes: list = []

    def post(self, request):
        credential_id = int(os.environ["BENCH_FLOOR_CREDENTIAL_ID"])
        outcome = store.key_acquire(credential_id=credential_id, key=request.META["HTTP_IDEMPOTENCY_KEY"],
                                    fingerprint="0" * 64, method="POST", path="/floor/events",
                                    retention_seconds=86400, lock_timeout_seconds=30)
        if isinstance(outcome, store.Acquired):
            with connection.cursor() as cursor:
                cursor.execute(_COMPLETE_SQL, [BODY, outcome.id, outcome.token])
        return Response({"ok": True}, status=202)
