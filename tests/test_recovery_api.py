"""POST /api/v1/endpoints/{id}/recover and GET /api/v1/recoveries/{id}: input, answers, idempotency, tenancy.

What a recovery sends, and in which order, is tested with real workers in tests/test_recovery_flow.py.
"""
from datetime import datetime, timedelta, timezone

import pytest
from django.db import transaction

from webhooks.models import Delivery, Endpoint, Recovery, Tenant
from webhooks.services.events import event_ingest
from webhooks.services.recovery import recovery_step

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def outage(api):
    """An endpoint whose deliveries of six events, one an hour from T0, all failed; and one other endpoint."""
    endpoint = api.post("endpoints", {"url": "https://a.example.com/"}).json()
    tenant = Tenant.objects.get(pk=api.tenant.pk)
    events = []
    for hour in range(6):
        with transaction.atomic():
            events.append(event_ingest(tenant=tenant, event_type="invoice.paid", data={"n": hour}, channels=[],
                                       now=T0 + timedelta(hours=hour)).id)
    Delivery.objects.filter(endpoint_id=endpoint["id"]).update(status=Delivery.FAILED, attempt_count=4,
                                                               next_attempt_at=None, updated_at=T0)
    return {"endpoint": endpoint["id"], "events": events}


def _recover(api, endpoint_id, body, **kwargs):
    return api.post(f"endpoints/{endpoint_id}/recover", body, **kwargs)


def test_recover_answers_202_with_the_documented_shape_and_location(api, outage):
    response = _recover(api, outage["endpoint"], {"since": "2026-03-01T13:00:00Z", "until": "2026-03-01T16:00:00Z"})
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["id"].startswith("rcv_") and body["endpoint_id"] == outage["endpoint"]
    assert body["since"] == "2026-03-01T13:00:00Z" and body["until"] == "2026-03-01T16:00:00Z"
    assert body["status"] == "running" and body["total"] == 3 and body["done"] == 0
    assert response["Location"].endswith(f"/api/v1/recoveries/{body['id']}")
    detail = api.get(f"recoveries/{body['id']}")
    assert detail.status_code == 200 and detail.json() == body


def test_without_until_it_goes_up_to_now(api, outage):
    body = _recover(api, outage["endpoint"], {"since": "2026-03-01T14:30:00Z"}).json()
    assert body["until"] is None and body["total"] == 3


def test_the_post_is_idempotent(api, outage):
    body = {"since": "2026-03-01T12:00:00Z"}
    first = _recover(api, outage["endpoint"], body, key="recover-key-0001")
    again = _recover(api, outage["endpoint"], body, key="recover-key-0001")
    assert again.status_code == 202 and again["Idempotent-Replay"] == "true" and again.content == first.content
    assert Recovery.objects.count() == 1
    other = _recover(api, outage["endpoint"], {"since": "2026-03-01T13:00:00Z"}, key="recover-key-0001")
    assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"
    missing = _recover(api, outage["endpoint"], body, key=None)
    assert missing.status_code == 400 and missing.json()["code"] == "idempotency_key_missing"
    assert Recovery.objects.count() == 1


@pytest.mark.parametrize("body, field", [
    ({}, "since"),
    ({"since": "last tuesday"}, "since"),
    ({"since": None}, "since"),
    ({"since": 1700000000}, "since"),
    ({"since": "2026-03-01T13:00:00Z", "until": "2026-02-30T00:00:00Z"}, "until"),
    ({"since": "2026-03-01T13:00:00Z", "until": "2026-03-01T12:00:00Z"}, "until"),
    ({"since": "2026-03-01T13:00:00Z", "until": "2026-03-01T13:00:00Z"}, "until"),
    ({"since": "0001-01-01T00:00:00+14:00"}, "since"),
    ({"since": "9999-12-31T23:59:59-05:00"}, "since"),
    ({"since": "2026-03-01T13:00:00Z" + "0" * 5000}, "since"),
])
def test_bad_input_is_a_validation_problem_and_records_nothing(api, outage, body, field):
    response = _recover(api, outage["endpoint"], body)
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "validation_error" and field in problem["errors"]
    assert Recovery.objects.count() == 0
    assert Delivery.objects.filter(status=Delivery.FAILED).count() == 6


@pytest.mark.parametrize("raw", ["[]", '"since"', "{", '{"since": 1e400}'])
def test_a_body_that_is_no_object_is_a_validation_problem(api, outage, raw):
    response = api.post(f"endpoints/{outage['endpoint']}/recover", raw=raw)
    assert response.status_code == 400 and response.json()["code"] == "validation_error"
    assert Recovery.objects.count() == 0


def test_unknown_deleted_and_other_tenants_endpoints_and_recoveries_are_404(api, other_api, outage):
    body = {"since": "2026-03-01T12:00:00Z"}
    assert _recover(api, "ep_nope", body).json()["code"] == "not_found"
    assert _recover(other_api, outage["endpoint"], body).status_code == 404
    recovery = _recover(api, outage["endpoint"], body).json()
    assert other_api.get(f"recoveries/{recovery['id']}").status_code == 404
    assert api.get("recoveries/rcv_nope").status_code == 404
    assert api.delete(f"endpoints/{outage['endpoint']}").status_code == 204
    assert _recover(api, outage["endpoint"], body).status_code == 404


def test_a_disabled_endpoint_is_a_conflict(api, outage):
    api.patch(f"endpoints/{outage['endpoint']}", {"enabled": False})
    response = _recover(api, outage["endpoint"], {"since": "2026-03-01T12:00:00Z"})
    assert response.status_code == 409 and response.json()["code"] == "conflict"
    assert Recovery.objects.count() == 0


def test_steps_release_batches_in_event_order_and_count_progress(api, outage, settings):
    """The step function alone (no worker): each batch is released only once the previous one had its
    attempts; only the expected step number runs."""
    settings.WEBHOOK_RECOVER_BATCH = 2
    recovery = _recover(api, outage["endpoint"], {"since": "2026-03-01T13:00:00Z"}).json()
    events = outage["events"]

    def pending_events():
        return sorted(Delivery.objects.filter(endpoint_id=outage["endpoint"], status=Delivery.PENDING)
                      .values_list("event_id", flat=True))

    assert recovery_step(recovery_id=recovery["id"], step=1) is None  # not the step it expects
    assert recovery_step(recovery_id=recovery["id"], step=0) == "running"
    assert pending_events() == events[1:3]
    assert recovery_step(recovery_id=recovery["id"], step=0) is None  # a duplicate of a step that ran
    assert recovery_step(recovery_id=recovery["id"], step=1) == "running"  # nothing attempted yet: waits
    assert pending_events() == events[1:3]
    assert api.get(f"recoveries/{recovery['id']}").json()["done"] == 0

    # one of the batch had its attempt (failed again, for good); the other's failed and will retry later
    first, second = Delivery.objects.filter(endpoint_id=outage["endpoint"], status=Delivery.PENDING).order_by("id")
    Delivery.objects.filter(pk=first.pk).update(status=Delivery.FAILED, next_attempt_at=None)
    assert recovery_step(recovery_id=recovery["id"], step=2) == "running"
    assert api.get(f"recoveries/{recovery['id']}").json()["done"] == 1
    assert pending_events() == [events[2]]
    Delivery.objects.filter(pk=second.pk).update(next_attempt_at=second.next_attempt_at + timedelta(seconds=5))
    assert recovery_step(recovery_id=recovery["id"], step=3) == "running"  # batch done: the next released
    assert pending_events() == [events[2], events[3], events[4]]
    assert api.get(f"recoveries/{recovery['id']}").json()["done"] == 2

    Delivery.objects.filter(event_id__in=events[3:5], endpoint_id=outage["endpoint"]).update(
        status=Delivery.SUCCEEDED, next_attempt_at=None)
    assert recovery_step(recovery_id=recovery["id"], step=4) == "running"  # the last one
    assert pending_events() == [events[2], events[5]]
    Delivery.objects.filter(event_id=events[5], endpoint_id=outage["endpoint"]).update(status=Delivery.SUCCEEDED)
    assert recovery_step(recovery_id=recovery["id"], step=5) == "completed"  # nothing more after it
    final = api.get(f"recoveries/{recovery['id']}").json()
    assert final["status"] == "completed" and final["total"] == final["done"] == 5
    assert final["completed_at"] is not None
    assert Delivery.objects.get(event_id=events[0], endpoint_id=outage["endpoint"]).status == Delivery.FAILED


def test_what_changed_after_the_recovery_was_made_is_left_out(api, outage):
    """A delivery resent by hand (or by another recovery) after this one was created is not resent by it."""
    recovery = _recover(api, outage["endpoint"], {"since": "2026-03-01T12:00:00Z"}).json()
    by_hand = Delivery.objects.get(event_id=outage["events"][0], endpoint_id=outage["endpoint"])
    assert api.post(f"deliveries/{by_hand.pk}/retry").status_code == 202
    Delivery.objects.filter(pk=by_hand.pk).update(status=Delivery.FAILED)  # …and failed again
    assert recovery_step(recovery_id=recovery["id"], step=0) == "running"
    pending = set(Delivery.objects.filter(status=Delivery.PENDING).values_list("event_id", flat=True))
    assert pending == set(outage["events"][1:])
    assert Recovery.objects.get(pk=recovery["id"]).batch and by_hand.pk not in Recovery.objects.get(
        pk=recovery["id"]).batch


def test_an_endpoint_disabled_meanwhile_ends_the_recovery_after_its_batch(api, outage, settings):
    settings.WEBHOOK_RECOVER_BATCH = 2
    recovery = _recover(api, outage["endpoint"], {"since": "2026-03-01T12:00:00Z"}).json()
    assert recovery_step(recovery_id=recovery["id"], step=0) == "running"
    Endpoint.objects.filter(pk=outage["endpoint"]).update(enabled=False)
    # the claims close the released deliveries (no attempt): the batch counts as done, nothing more goes
    Delivery.objects.filter(status=Delivery.PENDING).update(status=Delivery.FAILED, next_attempt_at=None)
    assert recovery_step(recovery_id=recovery["id"], step=1) == "completed"
    final = api.get(f"recoveries/{recovery['id']}").json()
    assert (final["status"], final["total"], final["done"]) == ("completed", 6, 2)
    assert Delivery.objects.filter(status=Delivery.FAILED).count() == 6
    assert Delivery.objects.filter(status=Delivery.PENDING).count() == 0


# -- one running recovery per endpoint (SPEC §11) ---------------------------------------------------


def test_a_second_recovery_while_one_runs_is_409_recovery_in_progress(api, outage):
    body = {"since": "2026-03-01T12:00:00Z"}
    first = _recover(api, outage["endpoint"], body)
    assert first.status_code == 202
    again = _recover(api, outage["endpoint"], {"since": "2026-03-01T14:00:00Z"})
    assert again.status_code == 409 and again["Content-Type"] == "application/problem+json"
    assert again.json()["code"] == "recovery_in_progress" and first.json()["id"] in again.json()["detail"]
    assert Recovery.objects.count() == 1
    # another endpoint's recovery is not held back by it
    other = api.post("endpoints", {"url": "https://b.example.com/"}).json()
    assert _recover(api, other["id"], body).status_code == 202
    # once the first completes, the endpoint may be recovered again
    Recovery.objects.filter(pk=first.json()["id"]).update(status=Recovery.COMPLETED)
    assert _recover(api, outage["endpoint"], body).status_code == 202


def test_recoveries_posted_at_the_same_moment_to_a_live_api_start_one_per_endpoint(api, processes):
    """Four recovers of each endpoint, sent at once from four threads to gunicorn's threads: exactly one
    starts, the others are 409 recovery_in_progress, round after round (no worker runs: they stay running)."""
    import threading
    import uuid

    import requests

    from tests.processes import free_port, gunicorn, warm

    server = warm(processes(gunicorn(free_port(), workers=2, threads=4)))
    endpoints = [api.post("endpoints", {"url": f"https://r{n}.example.com/"}).json()["id"] for n in range(15)]
    sessions = [requests.Session() for _ in range(4)]
    for endpoint_id in endpoints:
        answers: list = [None] * 4
        go = threading.Barrier(4)

        def recover(i: int) -> None:
            go.wait()
            answers[i] = sessions[i].post(
                f"{server.url}/api/v1/endpoints/{endpoint_id}/recover", json={"since": "2026-03-01T12:00:00Z"},
                timeout=30, headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": f"rcv-{uuid.uuid4()}"})

        threads = [threading.Thread(target=recover, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        statuses = sorted(answer.status_code for answer in answers)
        assert statuses == [202, 409, 409, 409], [answer.content for answer in answers]
        assert {a.json()["code"] for a in answers if a.status_code == 409} == {"recovery_in_progress"}
        assert Recovery.objects.filter(endpoint_id=endpoint_id, status=Recovery.RUNNING).count() == 1
    for session in sessions:
        session.close()
