"""Cursor pagination over time-ordered ids: `?cursor=<last id>&limit=N`, newest first (SPEC §4)."""
from django.db.models import QuerySet
from rest_framework import serializers

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


class PageParams(serializers.Serializer):
    cursor = serializers.CharField(required=False, max_length=40)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_LIMIT, default=DEFAULT_LIMIT)


def paginate(queryset: QuerySet, *, query_params) -> tuple[list, str | None]:
    """Return one page, newest first, and the cursor of the next page (None on the last)."""
    params = PageParams(data=query_params)
    params.is_valid(raise_exception=True)
    limit = params.validated_data["limit"]
    cursor = params.validated_data.get("cursor")
    if cursor:
        queryset = queryset.filter(pk__lt=cursor)
    rows = list(queryset.order_by("-pk")[: limit + 1])
    next_cursor = rows[limit - 1].pk if len(rows) > limit else None
    return rows[:limit], next_cursor
