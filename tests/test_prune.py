"""Pruning expired idempotency keys: exactly the expired ones, in batches."""
from datetime import timedelta

import pytest
from django.utils import timezone

from intake.idempotency.prune import keys_prune_expired
from intake.models import IdempotencyKey
from intake.tasks import prune_idempotency_keys

pytestmark = pytest.mark.django_db(transaction=True)


def _keys(credential, count, *, expired):
    now = timezone.now()
    expires = now - timedelta(seconds=1) if expired else now + timedelta(hours=1)
    IdempotencyKey.objects.bulk_create([
        IdempotencyKey(credential=credential, key=f"{'old' if expired else 'new'}-{n:06d}", fingerprint="f" * 64,
                       method="POST", path="/api/v1/events", response_status=202, response_headers=[],
                       response_body=b"{}", created_at=now, expires_at=expires)
        for n in range(count)])


def test_prune_deletes_exactly_the_expired_keys_in_batches(api):
    _keys(api.credential, 23, expired=True)
    _keys(api.credential, 7, expired=False)
    deleted, batches = keys_prune_expired(batch_size=5)
    assert (deleted, batches) == (23, 5)
    assert sorted(IdempotencyKey.objects.values_list("key", flat=True)) == [f"new-{n:06d}" for n in range(7)]
    assert keys_prune_expired(batch_size=5) == (0, 1)


def test_the_beat_task_prunes_with_the_configured_batch(api, settings):
    settings.IDEMPOTENCY_PRUNE_BATCH = 4
    _keys(api.credential, 9, expired=True)
    assert prune_idempotency_keys() == 9
    assert not IdempotencyKey.objects.exists()
