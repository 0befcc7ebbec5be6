"""Every destination kind (http and the brokers of SPEC §14) against the real servers on this machine.

The scenarios run once per kind (the `sink` fixture: a receiver, RabbitMQ, Redis or NATS JetStream behind a
proxy per endpoint); the brokers' own failures (a returned message, a wrong-type key, no stream) and their
connections (reused, bounded, closed when the endpoint changes) have tests of their own below.
"""
import time

import pytest
from standardwebhooks import Webhook

from tests.conftest import create_endpoint, wait_until
from tests.sinks import opened
from webhooks.delivery.destinations import brokers
from webhooks.delivery.engine import delivery_attempt
from webhooks.models import Delivery, DeliveryAttempt, DeliveryLease, Event

pytestmark = pytest.mark.django_db(transaction=True)


def _endpoint(api, sink, path="/hook", **extra):
    return create_endpoint(api, None, **{**sink.endpoint_fields(path), **extra})


def _deliveries(api, count, event_type="invoice.paid"):
    return [api.delivery_id(event_type, {"n": n}) for n in range(count)]


def _failed_once(delivery_id) -> DeliveryAttempt:
    """One attempt of the delivery (a retry schedule of "0" keeps it pending), which failed: its record."""
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.PENDING
    (attempt,) = DeliveryAttempt.objects.filter(delivery_id=delivery_id)
    return attempt


def _statuses(ids):
    return dict(Delivery.objects.filter(pk__in=ids).values_list("id", "status"))


def test_a_message_carries_the_webhooks_bytes_and_headers_and_verifies(api, sink, engine):
    endpoint = _endpoint(api, sink)
    event = api.send_event("invoice.paid", {"invoice": "in_1", "amount": 4200})
    assert engine.run([d["id"] for d in event["deliveries"]])
    (arrived,) = sink.wait_for(1)
    payload = Webhook(endpoint["secret"]).verify(arrived.body, arrived.headers)
    assert payload["data"] == {"invoice": "in_1", "amount": 4200}
    assert arrived.body == bytes(Event.objects.get(pk=event["id"]).payload)
    assert arrived.headers["webhook-id"] == event["id"]
    assert arrived.headers["content-type"] == "application/json"
    if sink.kind == "amqp":
        assert arrived.headers["message_id"] == event["id"]
        assert arrived.headers["content_type_property"] == "application/json"
        assert arrived.headers["delivery_mode"] == 2  # persistent
    if sink.kind == "nats":
        assert arrived.headers["Nats-Msg-Id"] == event["id"]
    (attempt,) = DeliveryAttempt.objects.filter(delivery_id=event["deliveries"][0]["id"])
    assert attempt.error == "" and Delivery.objects.get(pk=attempt.delivery_id).status == "succeeded"


def test_a_destination_that_is_down_fails_each_attempt_then_the_delivery_and_a_retry_succeeds(api, sink, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = "0"
    _endpoint(api, sink)
    sink.down("/hook")
    (delivery_id,) = _deliveries(api, 1)
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.PENDING
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.FAILED
    attempts = list(DeliveryAttempt.objects.filter(delivery_id=delivery_id).order_by("number"))
    assert [a.number for a in attempts] == [1, 2]
    if sink.kind == "http":
        assert [a.response_status for a in attempts] == [500, 500]
    else:
        assert all(a.error.startswith("connection_error") and a.response_status is None for a in attempts)
    sink.up("/hook")
    assert api.post(f"deliveries/{delivery_id}/retry").status_code == 202
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.SUCCEEDED
    assert len(sink.wait_for(1, "/hook")) == 1


def test_a_hanging_destination_is_a_timed_out_attempt_and_holds_back_no_other_tenant(api, other_api, sink, engine):
    _endpoint(api, sink, "/slow", max_in_flight=20)
    _endpoint(other_api, sink, "/fast")
    sink.hang("/slow")
    slow = _deliveries(api, 10)
    started = time.monotonic()
    for delivery_id in slow:
        engine.submit(delivery_id)
    fast = _deliveries(other_api, 3)
    assert engine.run(fast, timeout=15)
    sink.wait_for(3, "/fast", timeout=5)
    # tenant B's messages arrived while tenant A's attempts still hung (the deadline is 2 s in tests)
    assert max(a.at for a in sink.received("/fast")) - started < 2
    assert engine.drain(15)
    attempts = DeliveryAttempt.objects.filter(delivery_id__in=slow)
    assert attempts.count() == 10
    assert all(a.error.startswith("timeout") for a in attempts), [a.error for a in attempts]
    assert max(a.duration_ms for a in attempts) < 4000


def test_the_cap_holds_and_what_is_over_it_is_parked_without_an_attempt(api, sink, engine):
    endpoint = _endpoint(api, sink, max_in_flight=2)
    sink.hang("/hook")
    ids = _deliveries(api, 6)
    for delivery_id in ids:
        engine.submit(delivery_id)
    # the engine claims what has arrived in batches: the last four may be claimed (and parked) a turn later
    wait_until(lambda: Delivery.objects.filter(pk__in=ids, parked_at__isnull=False).count() == 4,
               message="four deliveries parked")
    assert DeliveryLease.objects.filter(endpoint_id=endpoint["id"]).count() == 2
    assert DeliveryAttempt.objects.filter(delivery_id__in=ids).count() == 0  # in flight, hanging
    sink.up("/hook")
    assert engine.drain(20)
    # each timed-out attempt handed its slot to a parked delivery; the two leases never became more
    assert DeliveryAttempt.objects.filter(delivery_id__in=ids).count() >= 6
    assert set(_statuses(ids).values()) <= {"succeeded", "pending"}


def test_a_private_broker_is_refused_at_create_and_at_connect_time(api, sink, engine, settings):
    fields = sink.endpoint_fields("/private")
    endpoint = create_endpoint(api, None, **{**fields, "event_types": ["private.*"]})  # allowed in tests
    delivery_id = api.delivery_id("private.happened")
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    refused = api.post("endpoints", {**fields, "event_types": ["x.*"]})
    assert refused.status_code == 400 and refused.json()["code"] == "validation_error"
    assert "url" in refused.json()["errors"]
    assert engine.run([delivery_id])
    (attempt,) = DeliveryAttempt.objects.filter(delivery_id=delivery_id)
    assert attempt.error.startswith("blocked_address"), attempt.error
    assert sink.received() == []
    assert DeliveryAttempt.objects.filter(delivery__endpoint_id=endpoint["id"]).count() == 1


# -- the brokers' own --------------------------------------------------------------------------------------


def _sink_of(kind):
    @pytest.fixture
    def fixture():
        with opened(kind) as made:
            yield made
    return fixture


amqp_sink, redis_sink, nats_sink = (_sink_of(kind) for kind in ("amqp", "redis_stream", "nats"))


def test_an_unroutable_amqp_message_is_returned_and_a_failed_attempt(api, amqp_sink, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = "0"
    _endpoint(api, amqp_sink)
    amqp_sink.unbind("/hook")
    (delivery_id,) = _deliveries(api, 1)
    attempt = _failed_once(delivery_id)
    assert attempt.error.startswith("amqp_returned"), attempt.error


def test_an_amqp_nack_is_a_failed_attempt(api, amqp_sink, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = "0"
    _endpoint(api, amqp_sink)
    amqp_sink.refuse("/hook")
    attempt = _failed_once(_deliveries(api, 1)[0])
    assert attempt.error.startswith("amqp_nack"), attempt.error


def test_an_amqp_exchange_that_does_not_exist_is_a_failed_attempt(api, amqp_sink, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = "0"
    _endpoint(api, amqp_sink, exchange="herald-test-no-such-exchange")
    attempt = _failed_once(_deliveries(api, 1)[0])
    assert "NOT_FOUND" in attempt.error or "404" in attempt.error, attempt.error


def test_redis_trims_the_stream_to_about_maxlen_and_an_error_reply_is_a_failed_attempt(api, redis_sink, engine,
                                                                                     settings):
    _endpoint(api, redis_sink, maxlen=10, event_types=["invoice.*"])
    ids = _deliveries(api, 300)
    assert engine.run(ids, timeout=30)
    assert set(_statuses(ids).values()) == {"succeeded"}
    assert redis_sink.entries("/hook") < 300  # MAXLEN ~ 10: trimmed by whole nodes, never below 10
    assert redis_sink.entries("/hook") >= 10
    wrong = redis_sink._client
    wrong.set(redis_sink.name("/wrong"), "a string, not a stream")
    _endpoint(api, redis_sink, "/wrong", event_types=["wrong.*"])
    settings.WEBHOOK_RETRY_SCHEDULE = "0"
    attempt = _failed_once(api.delivery_id("wrong.type"))
    assert attempt.error.startswith("redis_error") and "WRONGTYPE" in attempt.error, attempt.error


def test_nats_deduplicates_a_resent_message_and_no_stream_is_a_failed_attempt(api, nats_sink, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = "0"
    _endpoint(api, nats_sink)
    (delivery_id,) = _deliveries(api, 1)
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.SUCCEEDED
    assert api.post(f"deliveries/{delivery_id}/retry").status_code == 202
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.SUCCEEDED
    first, second = DeliveryAttempt.objects.filter(delivery_id=delivery_id).order_by("number")
    assert "duplicate" not in first.response_body and "duplicate" in second.response_body
    assert nats_sink.stream_messages() == 1  # the stream kept one: Nats-Msg-Id is the webhook-id
    nats_sink.delete_stream()
    attempt = _failed_once(_deliveries(api, 1)[0])
    assert attempt.error.startswith(("nats_error", "timeout")), attempt.error


@pytest.mark.parametrize("kind", ["amqp", "redis_stream", "nats"])
def test_connections_are_reused_bounded_and_closed_when_the_endpoint_changes(api, kind, engine, request):
    sink = request.getfixturevalue({"amqp": "amqp_sink", "redis_stream": "redis_sink", "nats": "nats_sink"}[kind])
    endpoint = _endpoint(api, sink, max_in_flight=50)
    for _ in range(3):
        ids = _deliveries(api, 40)
        assert engine.run(ids, timeout=20)
        assert set(_statuses(ids).values()) == {"succeeded"}, set(
            DeliveryAttempt.objects.filter(delivery_id__in=ids).exclude(error="").values_list("error", flat=True))
    opened = brokers.pools_open()
    (key,) = [key for key in opened if key[0] == endpoint["id"]]
    assert 1 <= opened[key] <= brokers.POOL_SIZE  # 120 attempts, a handful of connections
    # a change of the endpoint's destination: its old connections are closed at the next claim
    changed = api.patch(f"endpoints/{endpoint['id']}", {"url": sink.endpoint_fields("/hook")["url"]})
    assert changed.status_code == 200, changed.content
    from webhooks.delivery.destinations import access

    access._checked_at = 0.0  # the claim's check of live endpoints is due (it runs every 5 s otherwise)
    assert engine.run(_deliveries(api, 1))
    assert key not in brokers.pools_open()
    # deleted: closed too
    assert api.delete(f"endpoints/{endpoint['id']}").status_code == 204
    other = _endpoint(api, sink, "/other", event_types=["other.*"])
    access._checked_at = 0.0
    assert engine.run([api.delivery_id("other.thing")])
    assert all(k[0] != endpoint["id"] for k in brokers.pools_open())
    assert any(k[0] == other["id"] for k in brokers.pools_open())


def test_a_tenants_hanging_brokers_take_only_its_share_of_the_broker_threads(api, other_api, amqp_sink, engine):
    """Tenant A with as many hanging endpoints as there are broker threads: B's messages still go at once."""
    for n in range(brokers.BROKER_THREADS):
        _endpoint(api, amqp_sink, f"/hang{n}", event_types=["invoice.*"])
        amqp_sink.hang(f"/hang{n}")
    _endpoint(other_api, amqp_sink, "/b")
    started = time.monotonic()
    hanging = _deliveries(api, 2)  # each fans out to every hanging endpoint
    for event_delivery in hanging:
        engine.submit(event_delivery)
    for delivery in Delivery.objects.filter(tenant_id=api.tenant.pk).exclude(pk__in=hanging):
        engine.submit(delivery.pk)
    assert engine.run(_deliveries(other_api, 2), timeout=20)
    amqp_sink.wait_for(2, "/b", timeout=5)
    assert max(a.at for a in amqp_sink.received("/b")) - started < 2


def test_the_api_shows_a_broker_url_without_its_credentials_and_stores_them_encrypted(api, amqp_sink):
    from webhooks.models import EndpointAccess

    fields = amqp_sink.endpoint_fields()
    secret_url = fields["url"].replace("guest:guest", "guest:guest")
    created = api.post("endpoints", fields)
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["url"] == secret_url.replace("guest:guest@", "")
    assert body["exchange"] == amqp_sink.exchange and body["routing_key"] == fields["routing_key"]
    assert "guest:guest" not in created.content.decode()
    listed = api.get("endpoints").content.decode() + api.get(f"endpoints/{body['id']}").content.decode()
    assert "guest:guest" not in listed
    row = EndpointAccess.objects.get(endpoint_id=body["id"])
    assert "guest" not in row.encrypted_url and row.encrypted_url
    assert row.destination == {"kind": "amqp", "exchange": amqp_sink.exchange, "routing_key": fields["routing_key"]}


@pytest.mark.parametrize("body, field", [
    ({"kind": "amqp", "url": "amqp://127.0.0.1:5672/", "routing_key": "k"}, "exchange"),
    ({"kind": "amqp", "url": "amqp://127.0.0.1:5672/", "exchange": "x"}, "routing_key"),
    ({"kind": "amqp", "url": "http://127.0.0.1:5672/", "exchange": "x", "routing_key": "k"}, "url"),
    ({"kind": "amqp", "exchange": "x", "routing_key": "k"}, "url"),
    ({"kind": "amqp", "url": "amqp://127.0.0.1/", "exchange": "x y", "routing_key": "k"}, "exchange"),
    ({"kind": "amqp", "url": "amqp://127.0.0.1/", "exchange": "x", "routing_key": "k", "stream": "s"}, "stream"),
    ({"kind": "redis_stream", "url": "redis://127.0.0.1:6379/0"}, "stream"),
    ({"kind": "redis_stream", "url": "redis://127.0.0.1:6379/0", "stream": "s", "maxlen": 0}, "maxlen"),
    ({"kind": "redis_stream", "url": "redis://127.0.0.1:6379/0", "stream": "s", "maxlen": "ten"}, "maxlen"),
    ({"kind": "redis_stream", "url": "redis://127.0.0.1:6379/0", "stream": "s", "subject": "x"}, "subject"),
    ({"kind": "redis_stream", "url": "redis://127.0.0.1:6379/0?x=1", "stream": "s"}, "url"),
    ({"kind": "nats", "url": "nats://127.0.0.1:4222", "subject": "a.*"}, "subject"),
    ({"kind": "nats", "url": "nats://127.0.0.1:4222"}, "subject"),
    ({"kind": "nats", "url": "nats://127.0.0.1:4222", "subject": "s", "headers": {"X-A": "b"}}, "headers"),
    ({"kind": "nats", "url": "nats://127.0.0.1:4222", "subject": "s", "auth": {"type": "bearer", "token": "t"}},
     "auth"),
    ({"url": "http://127.0.0.1:1/hook", "exchange": "x"}, "exchange"),
    ({"url": "amqp://127.0.0.1:5672/"}, "url"),
    ({"kind": "poll", "subject": "s"}, "subject"),
    ({"kind": "kafka", "url": "kafka://127.0.0.1:9092"}, "kind"),
])
def test_wrong_missing_or_foreign_fields_are_400_and_change_nothing(api, body, field):
    from webhooks.models import Endpoint

    response = api.post("endpoints", body)
    assert response.status_code == 400, response.content
    problem = response.json()
    assert problem["code"] == "validation_error" and field in problem["errors"], problem
    assert response["Content-Type"].startswith("application/problem+json")
    assert not Endpoint.objects.exists()


def test_patch_changes_a_brokers_fields_keeps_the_others_and_refuses_another_kinds(api, redis_sink):
    from webhooks.models import EndpointAccess

    endpoint = _endpoint(api, redis_sink)
    patched = api.patch(f"endpoints/{endpoint['id']}", {"maxlen": 1000})
    assert patched.status_code == 200, patched.content
    assert patched.json()["maxlen"] == 1000 and patched.json()["stream"] == redis_sink.name("/hook")
    refused = api.patch(f"endpoints/{endpoint['id']}", {"exchange": "x"})
    assert refused.status_code == 400 and "exchange" in refused.json()["errors"]
    refused = api.patch(f"endpoints/{endpoint['id']}", {"url": "amqp://127.0.0.1/"})
    assert refused.status_code == 400 and "url" in refused.json()["errors"]
    assert EndpointAccess.objects.get(endpoint_id=endpoint["id"]).destination["maxlen"] == 1000


def test_another_tenant_can_neither_read_nor_change_a_broker_endpoint(api, other_api, amqp_sink):
    endpoint = _endpoint(api, amqp_sink)
    assert other_api.get(f"endpoints/{endpoint['id']}").status_code == 404
    assert other_api.patch(f"endpoints/{endpoint['id']}", {"routing_key": "theirs"}).status_code == 404
    assert api.get(f"endpoints/{endpoint['id']}").json()["routing_key"] == endpoint["routing_key"]


def test_a_burst_to_one_stream_arrives_whole_and_once(api, engine):
    """Not a benchmark (bench/ measures the rate): 200 claims of one endpoint, sent in the engine's batches."""
    with opened("redis_stream") as made:
        _endpoint(api, made, max_in_flight=200)
        ids = _deliveries(api, 200)
        assert engine.run(ids, timeout=30)
        assert set(_statuses(ids).values()) == {"succeeded"}
        assert made.entries("/hook") == 200


def test_key_rotation_re_encrypts_a_brokers_url(api, settings):
    import io

    from cryptography.fernet import Fernet
    from django.core.management import call_command

    from webhooks.models import EndpointAccess

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.HERALD_ENCRYPTION_KEYS = [old]
    url = "amqp://herald:s3cret-pass@127.0.0.1:5672/orders"
    created = api.post("endpoints", {"kind": "amqp", "url": url, "exchange": "x", "routing_key": "k"})
    assert created.status_code == 201, created.content
    before = EndpointAccess.objects.get().encrypted_url
    settings.HERALD_ENCRYPTION_KEYS = [new, old]
    call_command("reencrypt_secrets", stdout=io.StringIO())
    after = EndpointAccess.objects.get().encrypted_url
    assert after != before and Fernet(new).decrypt(after.encode()).decode() == url
