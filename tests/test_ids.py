"""Identifiers: prefixed ULIDs that sort in creation order (a fifo endpoint relies on it)."""
import os
import time

from webhooks import ids
from webhooks.ids import delivery_id, event_id


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
