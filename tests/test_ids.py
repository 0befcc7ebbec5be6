"""Identifiers: prefixed ULIDs that sort in creation order (a fifo endpoint relies on it)."""
import os
import time

import pytest
from django.db import connection, transaction

from webhooks import ids
from webhooks.ids import delivery_id, event_id
from webhooks.models import Delivery, Endpoint, Tenant
from webhooks.services.events import event_ingest


def test_ids_are_unique_and_sort_in_creation_order_even_within_one_millisecond():
    ids = [event_id() for _ in range(20_000)]  # thousands share a millisecond
    assert len(set(ids)) == len(ids)
    assert sorted(ids) == ids
    assert all(i.startswith("evt_") and len(i) == 30 for i in ids[:10])


def test_a_forked_child_does_not_continue_from_its_parents_last_id(monkeypatch):
    # the parent's last id is in this millisecond's future, so a child that kept it would make last + 1
    monkeypatch.setattr(ids, "_last", (time.time_ns() // 1_000_000 + 10_000) << 80)
    read, write = os.pipe()
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:  # child: report the id it makes, at once
            os.write(write, (delivery_id() + "\n").encode())
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    os.close(write)
    with os.fdopen(read) as pipe:
        made = pipe.read().split()
    assert len(made) == 2 and made[0] != made[1]


@pytest.mark.slow  # about 11 s: a hundred thousand deliveries and their outbox rows
@pytest.mark.django_db(transaction=True)
def test_delivery_ids_stay_unique_past_100000_matching_endpoints_and_after_the_events_before():
    """A delivery's id is its event's ULID and the endpoint's rank; the rank was cut to five digits, so the
    100,000th endpoint's delivery took the 10,000th's id and the whole event failed."""
    tenant = Tenant.objects.create(name="wide")
    count = 100_001
    with connection.cursor() as cursor:  # as many endpoints as that in one statement: the API is not the subject
        cursor.execute(f"""
            INSERT INTO {Endpoint._meta.db_table} (id, tenant_id, url, description, event_types, channels, enabled,
                disabled_reason, ordering, consecutive_failures, failed_probes, created_at, updated_at)
            SELECT 'ep_' || lpad(n::text, 26, '0'), %s, 'https://hooks.example.com/' || n, '', '{{}}', '{{}}', true,
                   '', 'unordered', 0, 0, now(), now()
              FROM generate_series(1, %s) AS n""", [tenant.pk, count])
    with transaction.atomic():
        first = event_ingest(tenant=tenant, event_type="invoice.paid", data={}, channels=[])
    with transaction.atomic():
        second = event_ingest(tenant=tenant, event_type="invoice.paid", data={}, channels=[])
    made = [delivery.id for delivery in first.delivery_list]
    assert len(made) == len(set(made)) == count == Delivery.objects.filter(event=first).count()
    assert max(len(i) for i in made) <= Delivery._meta.get_field("id").max_length
    assert sum(len(i) == 35 for i in made) == 99_999  # ids of the usual sizes are as they always were
    # time-ordered: every delivery of the later event sorts after every one of the earlier
    assert max(made) < min(delivery.id for delivery in second.delivery_list)
