import json

from django.db import connection, transaction
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

TABLE_SQL = """
CREATE TABLE IF NOT EXISTS idem (
    id bigserial PRIMARY KEY, cred bigint NOT NULL, key varchar(255) NOT NULL, fp varchar(64) NOT NULL,
    status varchar(16) NOT NULL DEFAULT 'in_progress', locked_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL, resp_status smallint, resp_body bytea, UNIQUE (cred, key))
"""
_INSERT = """
INSERT INTO idem (cred, key, fp, locked_at, expires_at) VALUES (1, %s, %s, now(), now() + interval '24 hours')
ON CONFLICT DO NOTHING RETURNING id
"""
_UPDATE = "UPDATE idem SET status = 'completed', resp_status = 202, resp_body = %s WHERE id = %s"
BODY = {"id": "evt_floor", "status": "accepted"}


class BareFloorView(APIView):
    def post(self, request):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_INSERT, [request.META.get("HTTP_IDEMPOTENCY_KEY", ""), "0" * 64])
            row = cursor.fetchone()
            if row is not None:
                cursor.execute(_UPDATE, [json.dumps(BODY).encode(), row[0]])
        return Response(BODY, status=202)


urlpatterns = [path("floor/events", BareFloorView.as_view())]
