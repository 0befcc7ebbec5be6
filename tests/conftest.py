"""Shared fixtures: credentials, an API client, and a look into the real Redis queue."""
import base64
import json
import shutil
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.test import Client

from intake.credentials import credential_cache_clear, credential_create
from tests import fuzzing  # noqa: F401 - picks the run's fuzz seed in the controller, before xdist's workers start
from webhooks.delivery.publishing import publisher
from webhooks.delivery.relay import deliveries_relay


# tests/processes.py's RUN_DIR: every Herald process's output during the session
_RUN_DIR = Path(__file__).resolve().parent / "artifacts" / "run"


def _flush_retried_on_deadlock():
    """A transactional test's teardown empties the database with one TRUNCATE of every table, while a
    module's worker or beat (left running across its tests) may still be recording an attempt: the two take
    their table locks in different orders and PostgreSQL breaks the deadlock by aborting one of them. When it
    aborts the TRUNCATE, Django's flush fails, the next test starts on the last one's rows (CI once saw a
    redirect test read the previous test's retried delivery). The worker's transaction goes on once the
    TRUNCATE is gone, so the flush is tried again; any other failure is raised as before."""
    import time

    from django.core.management.base import CommandError
    from django.test import TransactionTestCase

    teardown = TransactionTestCase._fixture_teardown

    def deadlocked(error: BaseException) -> bool:
        while error is not None:
            if getattr(getattr(error, "diag", None), "sqlstate", None) == "40P01":
                return True
            error = error.__cause__
        return False

    def _fixture_teardown(self):
        for attempt in range(5):
            try:
                return teardown(self)
            except CommandError as error:
                if attempt == 4 or not deadlocked(error):
                    raise
                time.sleep(0.2 * (attempt + 1))  # a pause before trying again, not a wait for a result

    TransactionTestCase._fixture_teardown = _fixture_teardown


_flush_retried_on_deadlock()


def pytest_report_header(config):
    from tests.fuzzing import ENV, SEED

    return f"fuzz seed: {SEED} (replay a fuzzer's failure with {ENV}={SEED} scripts/test …)"


def pytest_sessionstart(session):
    session.config.herald_etc_hosts = Path("/etc/hosts").read_bytes()
    if not hasattr(session.config, "workerinput"):  # once, in the controller of an xdist run
        shutil.rmtree(_RUN_DIR, ignore_errors=True)


# Files scheduled by their parameters rather than whole (see pytest_xdist_make_scheduler): a file of tests that
# each run once per module-scoped parameter, each parameter's fixtures its own. test_client_outbox.py (a database
# a parameter) took 385-545 s in one process and ended the suite's runs (docs/testing.md).
_SCHEDULED_BY_PARAMETER = ("tests/test_client_outbox.py",)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """scripts/test's `--dist loadfile` (a file's tests in one process, its module fixtures made once), except that
    the files named above go out a parameter at a time: each parameter is a unit of the same kind, in a process
    of its own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByFileAndParameter(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path in _SCHEDULED_BY_PARAMETER and nodeid.endswith("]") and "[" in nodeid:
                return f"{path}[{nodeid.rsplit('[', 1)[1]}"
            return path

    return ByFileAndParameter(config, log)


def _on_rabbitmq() -> bool:
    return settings.CELERY_BROKER_URL.startswith(("amqp://", "pyamqp://"))


def pytest_collection_modifyitems(config, items):
    """On RabbitMQ (HERALD_TEST_BROKER=rabbitmq), leave out the tests that read Redis's queues themselves
    (the `broker` fixture) or restart a private redis-server: they are the Redis run's."""
    if not _on_rabbitmq():
        return
    redis_only = [item for item in items if "broker" in getattr(item, "fixturenames", ())
                  or item.get_closest_marker("redis_only")]
    if redis_only:
        config.hook.pytest_deselected(items=redis_only)
        items[:] = [item for item in items if item not in redis_only]


def pytest_sessionfinish(session, exitstatus):
    """No Herald process may ever write a signing secret to its log, and no test the machine's /etc/hosts:
    the session fails if one did.
    On RabbitMQ, the run's queues (durable) are deleted."""
    if _on_rabbitmq():
        from config.celery import app

        with app.connection_for_write() as conn:
            for queue in (settings.CELERY_TASK_DEFAULT_QUEUE, settings.HERALD_PERIODIC_QUEUE):
                try:
                    conn.default_channel.queue_delete(queue)
                except Exception:  # noqa: BLE001 - never declared in this run
                    pass
    if Path("/etc/hosts").read_bytes() != session.config.herald_etc_hosts:
        # the machine's resolver file is every process's: a test that needs a name gives it a namespace or a
        # lookup of its own (tests/processes.py hosts_launcher, test_proxy_egress's _hosts_entry)
        session.config.get_terminal_writer().line("a test changed the machine's /etc/hosts", red=True)
        session.exitstatus = 1
    leaked = sorted(str(path.relative_to(_RUN_DIR)) for path in _RUN_DIR.rglob("*.log")
                    if b"whsec_" in path.read_bytes())
    if leaked:
        session.config.get_terminal_writer().line(f"signing secrets in process logs: {', '.join(leaked)}", red=True)
        session.exitstatus = 1


@pytest.fixture(autouse=True)
def _fresh_credential_cache():
    credential_cache_clear()


@pytest.fixture
def days_restored(transactional_db):
    """For a test whose retention drops day partitions (today's too, when it prunes as if a month later): when it
    ends, its history goes and the days around today are made again, so that the next test's rows land in
    their day as they would on a live system (with today's rows waiting in the default partition, its
    partition could not be made)."""
    yield
    from django.db import connection

    from webhooks.services import partitions

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(part.table for part in partitions.TABLES)}")
    partitions.ensure()


@pytest.fixture
def fresh_tokens():
    """This process's OAuth2 token cache (webhooks/delivery/destinations/access.py) empty before and after the test, so that a token
    one test fetched is never another's (the endpoint access and proxy tests use it on every test)."""
    from webhooks.delivery.destinations import access

    access.tokens.clear()
    yield
    access.tokens.clear()


@pytest.fixture
def broker():
    """The real Redis broker: purge the test queue first, then read what was published to it."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queues = (settings.CELERY_TASK_DEFAULT_QUEUE, settings.HERALD_PERIODIC_QUEUE)
    client.delete(*queues)

    class Broker:
        redis = client

        @staticmethod
        def published(queue: str | None = None) -> list[tuple[str, list]]:
            """(task name, args) of every message waiting in Herald's queues (or one), oldest first, once a
            relay has published what is due (as a worker's relay would, at once) and this process's
            publisher what it was handed."""
            return [(task, args) for _, task, args in Broker.messages(queue)]

        @staticmethod
        def messages(queue: str | None = None) -> list[tuple[bytes, str, list]]:
            """(raw message, task name, args) of every message waiting, oldest first (see `published`)."""
            Broker.relay()
            out = []
            for name in (queue,) if queue else queues:
                for raw in reversed(client.lrange(name, 0, -1)):
                    message = json.loads(raw)
                    args = json.loads(base64.b64decode(message["body"]))[0]
                    out.append((raw, message["headers"]["task"], args))
            return out

        @staticmethod
        def clear() -> None:
            """Forget every message, including what a relay would publish now: as if lost."""
            Broker.relay()
            client.delete(*queues)

        @staticmethod
        def relay() -> list[str]:
            """What a worker's relay does when the doorbell rings: publish what is due and unpublished
            (on a connection of its own, as in a worker: it sees only what has committed)."""
            import threading

            from django.db import connection

            assert publisher.flush(10), "the publisher did not publish within 10 s"
            published = []

            def run():
                try:
                    published.extend(deliveries_relay())
                finally:
                    connection.close()

            thread = threading.Thread(target=run)
            thread.start()
            thread.join(30)
            return published

        @classmethod
        def delivery_ids(cls) -> list[str]:
            """The delivery ids of every delivery message waiting, oldest first."""
            return [delivery_id for task, args in cls.published() if task == "webhooks.deliver_many"
                    for delivery_id in args[0]]

    yield Broker
    client.delete(*queues)


class Api:
    """A Django test client speaking to /api/v1/ with one credential."""

    def __init__(self, token: str, credential):
        self.token = token
        self.credential = credential
        self.tenant = credential.tenant
        self.client = Client(raise_request_exception=False)

    def _headers(self, key, extra):
        headers = {"Authorization": f"Bearer {self.token}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        headers.update(extra or {})
        return headers

    def get(self, path, **params):
        return self.client.get(f"/api/v1/{path}", params, headers=self._headers(None, None))

    def post(self, path, body=None, *, key="auto", raw=None, content_type="application/json", headers=None):
        key = f"key-{uuid.uuid4()}" if key == "auto" else key
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        return self.client.post(f"/api/v1/{path}", data, content_type=content_type,
                                headers=self._headers(key, headers))

    def patch(self, path, body, *, key="auto"):
        key = f"key-{uuid.uuid4()}" if key == "auto" else key
        return self.client.patch(f"/api/v1/{path}", json.dumps(body), content_type="application/json",
                                 headers=self._headers(key, None))

    def delete(self, path):
        return self.client.delete(f"/api/v1/{path}", headers=self._headers(None, None))

    def send_event(self, event_type: str, data=None, **fields) -> dict:
        """POST /api/v1/events `{"type": event_type, "data": data ({} if None), **fields}`; the accepted event
        (fails the test on anything but 202)."""
        response = self.post("events", {"type": event_type, "data": {} if data is None else data, **fields})
        assert response.status_code == 202, response.content
        return response.json()

    def delivery_id(self, event_type: str, data=None, **fields) -> str:
        """`send_event`, and the id of the event's first delivery (its only one where one endpoint matches)."""
        return self.send_event(event_type, data, **fields)["deliveries"][0]["id"]


def make_api(tenant_name: str) -> Api:
    credential, token = credential_create(tenant_name=tenant_name)
    return Api(token, credential)


@pytest.fixture
def api(db):
    return make_api("acme")


@pytest.fixture
def other_api(db):
    return make_api("globex")


def subprocess_env(**extra) -> dict:
    """Environment for a Herald process started by a test: same settings, the test database."""
    import os

    from django.db import connection

    params = connection.settings_dict
    user = params.get("USER") or ""
    auth = f"{user}@" if user else ""
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"postgres://{auth}{params.get('HOST') or '127.0.0.1'}:{params.get('PORT') or 5432}/"
                        f"{params['NAME']}",
        "PYTHONUNBUFFERED": "1",
    })
    env.update({key: str(value) for key, value in extra.items()})
    return env


@pytest.fixture
def processes():
    """Start Herald processes (tests/processes.py) through this; each is stopped when the test ends."""
    started = []

    def start(process):
        started.append(process)
        return process

    yield start
    for process in reversed(started):
        process.stop()
    if any(process.name == "beat" for process in started):
        _purge(settings.HERALD_PERIODIC_QUEUE)


def _purge(queue: str) -> None:
    """Drop what waits in one of this session's queues (on Redis or RabbitMQ). A beat that ran without a
    worker leaves its dispatcher's ticks there; the next test's worker would find them expired and log
    `Discarding revoked task` for each (a test of quiet logs failed on that)."""
    from celery import current_app

    with current_app.connection_for_write() as connection:
        try:
            connection.default_channel.queue_purge(queue)
        except connection.channel_errors:   # RabbitMQ: no such queue (nothing was ever sent to it)
            pass


@pytest.fixture
def engine():
    """A worker's delivery engine (webhooks/delivery/engine.py) running in this process; empty when the test ends."""
    from webhooks.delivery.engine import Engine

    class _Engine(Engine):
        def run(self, delivery_ids, timeout: float = 10.0) -> bool:
            """Hand over each of `delivery_ids`, in order; whether all were finished within `timeout` s."""
            for delivery_id in delivery_ids:
                self.submit(delivery_id)
            return self.drain(timeout)

    instance = _Engine(concurrency=50)
    yield instance
    drained = instance.drain(15)
    instance.stop()  # before the database is emptied: a throttled endpoint's wake-up would query it
    assert drained, "the engine still held deliveries at the end of the test"


def create_endpoint(api, url: str | None = None, /, **extra) -> dict:
    """POST /api/v1/endpoints through `api`; the created endpoint (fails the test on anything but 201),
    with its signing secret added under "secret" from GET …/secret (the body never carries it; for a v1a
    endpoint, its public key). With `url` None the fields are all in `extra` (a sink's, tests/sinks.py)."""
    response = api.post("endpoints", extra if url is None else {"url": url, **extra})
    assert response.status_code == 201, response.content
    endpoint = response.json()
    assert "secret" not in endpoint
    secret = api.get(f"endpoints/{endpoint['id']}/secret")
    assert secret.status_code == 200, secret.content
    shown = secret.json()  # {secret} (v1), or {public_key} (v1a): what a receiver verifies with
    return {**endpoint, "secret": shown.get("secret") or shown["public_key"]}


def attempts_max_overlap(attempts) -> int:
    """Most of these attempts (a DeliveryAttempt queryset) in flight at one moment, from Herald's own records."""
    edges = []
    for started_at, duration_ms in attempts.values_list("started_at", "duration_ms"):
        start = started_at.timestamp()
        edges += [(start, 1), (start + duration_ms / 1000, -1)]
    current = peak = 0
    for _, step in sorted(edges, key=lambda edge: (edge[0], edge[1])):
        current += step
        peak = max(peak, current)
    return peak


def other_session(*, autocommit: bool = True):
    """A psycopg session of its own on the test database, as another process's would be (committing each
    statement at once unless `autocommit` is False)."""
    import psycopg
    from django.db import connection

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=autocommit)


def past_todays_partition():
    """A moment at which all of today's history partition is past retention, whatever day of its span today is:
    for a test that prunes what it made today. Partitions span HISTORY_PARTITION_DAYS days from a Monday
    (webhooks/services/partitions.py), so "retention plus a day" reaches today's partition only on its last
    day (the retention tests passed on Sundays alone with weekly partitions)."""
    from datetime import timedelta

    from django.utils import timezone

    from webhooks.conf import herald_settings

    retention = herald_settings.retention
    return timezone.now() + timedelta(days=retention.EVENT_RETENTION_DAYS + retention.HISTORY_PARTITION_DAYS + 1)


def all_succeeded(delivery_ids) -> bool:
    from webhooks.models import Delivery

    return Delivery.objects.filter(pk__in=delivery_ids, status=Delivery.SUCCEEDED).count() == len(delivery_ids)


@pytest.fixture
def receiver():
    from tests.receiver import Receiver

    server = Receiver()
    yield server
    server.close()


@pytest.fixture(params=["http", "amqp", "redis_stream", "nats"])
def sink(request):
    """Where a scenario's deliveries arrive, once per destination kind (tests/sinks.py): a real receiver, or
    RabbitMQ, Redis or NATS JetStream on this machine behind a proxy per endpoint. The worker's broker
    connections (this process's engine's) are closed with it."""
    from tests.sinks import opened

    with opened(request.param) as made:
        yield made


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05, message: str = "condition"):
    """Poll until `predicate()` is truthy; return its value or fail the test after `timeout` seconds
    (testkit's wait, its TimeoutError as a test failure)."""
    from testkit.processes import wait_until as poll

    try:
        return poll(predicate, timeout, interval, what=message)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None
