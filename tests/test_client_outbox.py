"""The Django outbox of the client package (`herald_client.django`, SPEC §13) against Herald's real processes.

A small platform project (tests/platform_project) publishes rows in its own transactions and runs
`herald_relay` as its own processes, on PostgreSQL, MariaDB and SQLite in turn; Herald is a real gunicorn
and Celery worker on the test database. What must hold: a rolled-back transaction sends nothing; a relay
SIGKILLed at random moments and started again leaves exactly one Herald event per committed row, in order
per tenant; Herald stopped and started again, everything arrives, in order; two relays at once send each
row once; a row Herald refuses for good is kept, failed, with Herald's problem, and the relay goes on.
"""
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from contextlib import closing

import psycopg
import pytest

from herald_client import Herald, RetryPolicy
from tests.conftest import wait_until
from tests.processes import ROOT, Process, free_port, gunicorn
from tests.test_client import server  # noqa: F401 - the live API and a worker, started for this module
from tests.test_client_platform import _platform_token
from webhooks.models import Event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DATABASES = ("postgresql", "mariadb", "sqlite")
# How many times the kill test SIGKILLs a relay per database, and the deadline (a failure) for doing so.
KILLS = int(os.environ.get("OUTBOX_TEST_KILLS", "50"))
KILL_SECONDS = float(os.environ.get("OUTBOX_TEST_KILL_SECONDS", "300"))  # a deadline for the kills, not a cap
# How many of the relay's rounds fail to reach Herald while it is down (backing off 0.25 s, doubling, up to 1 s).
HERALD_DOWN_TRIES = int(os.environ.get("OUTBOX_TEST_DOWN_TRIES", "6"))


@pytest.fixture(scope="module", params=DATABASES)
def platform_db(request, tmp_path_factory):
    """A fresh database of the platform project, migrated (`python -m django migrate`)."""
    name = f"herald_platform_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{uuid.uuid4().hex[:8]}"
    kind = request.param
    if kind == "postgresql":
        with psycopg.connect("host=127.0.0.1 dbname=postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = f"postgres://127.0.0.1:5432/{name}"
    elif kind == "mariadb":
        with _mariadb() as conn:
            conn.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        url = f"mysql://root@127.0.0.1:3306/{name}"
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('platform') / 'platform.sqlite3'}"
    _platform(url, {"migrate": True})
    yield url
    if kind == "postgresql":
        with psycopg.connect("host=127.0.0.1 dbname=postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    elif kind == "mariadb":
        with _mariadb() as conn:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")


def _mariadb(database: str | None = None):
    """A PyMySQL connection to the local MariaDB (127.0.0.1:3306, root without a password)."""
    import pymysql

    return pymysql.connect(host="127.0.0.1", port=3306, user="root", password="", database=database)


def _env(url: str, api_url: str = "", token: str = "") -> dict:
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "HERALD_API_URL", "HERALD_TOKEN")}
    env.update({"DJANGO_SETTINGS_MODULE": "tests.platform_project.settings", "PLATFORM_DATABASE_URL": url,
                "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    if api_url:
        env.update({"HERALD_API_URL": api_url, "HERALD_TOKEN": token})
    return env


def _platform(url: str, spec: dict) -> list[int]:
    """Run the platform's own code (tests/platform_project/publish.py); the committed rows' ids."""
    done = subprocess.run([sys.executable, "-m", "tests.platform_project.publish", json.dumps(spec)], cwd=ROOT,
                          env=_env(url), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _relay_once(url: str, api_url: str, token: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "django", "herald_relay", "--once", *args], cwd=ROOT,
                          env=_env(url, api_url, token), capture_output=True, text=True, timeout=300)


def _relay(url: str, api_url: str, token: str, *args: str, name: str = "relay", wait: bool = True) -> Process:
    """`herald_relay` running (each round logged with -v 2), ready once it says where it sends to (unless
    not `wait`: returned as soon as started)."""
    return Process(name, [sys.executable, "-m", "django", "herald_relay", "-v", "2", "--interval", "0.1",
                          "--max-backoff", "1", *args], _env(url, api_url, token),
                   ready="herald_relay: sending to" if wait else None, timeout=60)


def _rounds(output: str) -> list[tuple[int, int]]:
    """(sent, replayed) of each round a relay reported (`herald_relay: sent N, failed F, replayed R`)."""
    rounds = []
    for line in output.splitlines():
        if line.startswith("herald_relay: sent"):
            fields = dict(part.strip().split(" ")[:2] for part in line.removeprefix("herald_relay: ").split(","))
            rounds.append((int(fields["sent"]), int(fields["replayed"])))
    return rounds


def _outbox(url: str) -> dict[str, int]:
    """The outbox's rows by status, read from the platform's database (herald_client's table) in this process:
    tests wait on it, and a Python process per read cost ~0.7 s each."""
    query = "SELECT status, COUNT(*) FROM herald_outbox_message GROUP BY status"
    if url.startswith("postgres"):
        with psycopg.connect(url) as conn:
            return dict(conn.execute(query).fetchall())
    if url.startswith("mysql"):
        with _mariadb(url.rsplit("/", 1)[1]) as conn, conn.cursor() as cursor:
            cursor.execute(query)
            return dict(cursor.fetchall())
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)) as conn:
        return dict(conn.execute(query).fetchall())


def _sent(tenant_id: str) -> list[int]:
    """Herald's events of the tenant, oldest first: each one's `n`."""
    return [event.data.get("n") for event in Event.objects.filter(tenant_id=tenant_id).order_by("id")]


@pytest.fixture
def platform(server):  # noqa: F811 - the imported fixture
    token = _platform_token()
    client = Herald(server.url, token, retry=RetryPolicy(base_delay=0.05))
    client.token = token
    yield client
    client.close()


def _tenants(platform, count: int) -> list[dict]:
    return [platform.tenants.create(f"Customer {n}", uid=f"cust-{uuid.uuid4().hex[:10]}") for n in range(count)]


def _rows(tenants: list[dict], per_tenant: int, *, rollback_every: int = 0) -> list[dict]:
    """Rows interleaved across tenants (addressed by uid), n counting up per tenant."""
    rows = []
    for n in range(per_tenant):
        for tenant in tenants:
            rows.append({"tenant": tenant["uid"], "n": n,
                         "rollback": bool(rollback_every) and n % rollback_every == rollback_every - 1})
    return rows


def _committed(rows: list[dict], per_transaction: int, tenant: dict) -> list[int]:
    """The `n`s of `tenant` whose transaction committed (a transaction with a rollback row rolls back)."""
    kept = []
    for start in range(0, len(rows), per_transaction):
        group = rows[start:start + per_transaction]
        if not any(row["rollback"] for row in group):
            kept.extend(row["n"] for row in group if row["tenant"] == tenant["uid"])
    return kept


def test_a_rolled_back_transaction_sends_nothing_and_a_committed_one_is_sent_once(platform_db, platform, server):  # noqa: F811
    (tenant,) = _tenants(platform, 1)
    _platform(platform_db, {"reset": True})
    rows = _rows([tenant], 12, rollback_every=4)  # transactions of two rows: every second one rolls back
    committed = _platform(platform_db, {"rows": rows, "per_transaction": 2})
    expected = _committed(rows, 2, tenant)
    assert len(committed) == len(expected) == 6

    done = _relay_once(platform_db, server.url, platform.token)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sent 6, failed 0, pending 0" in done.stdout
    assert _sent(tenant["id"]) == expected

    # what Herald would refuse is a ValueError at once, and the caller's transaction goes on
    refused, row_id = _platform(platform_db, {"invalid": tenant["uid"]})
    assert refused == 5 and row_id > max(committed)
    expected.append(None)

    again = _relay_once(platform_db, server.url, platform.token)  # sent rows are never sent again
    assert again.returncode == 0 and "sent 1, failed 0, pending 0" in again.stdout, again.stdout
    assert _sent(tenant["id"]) == expected
    assert _outbox(platform_db) == {"sent": 7}
    once_more = _relay_once(platform_db, server.url, platform.token)
    assert once_more.returncode == 0 and "sent 0, failed 0, pending 0" in once_more.stdout
    assert _sent(tenant["id"]) == expected


def test_a_row_herald_refuses_is_kept_failed_with_its_problem_and_the_relay_goes_on(platform_db, platform, server):  # noqa: F811
    (tenant,) = _tenants(platform, 1)
    _platform(platform_db, {"reset": True})
    # an unknown tenant (404), and no tenant at all with a platform token (400 tenant_required), between
    # good rows
    _platform(platform_db, {"rows": [{"tenant": tenant["uid"], "n": 0}, {"tenant": "nobody-at-all", "n": 1},
                                     {"tenant": None, "n": 2}, {"tenant": tenant["uid"], "n": 3}]})

    done = _relay_once(platform_db, server.url, platform.token)

    assert done.returncode == 0, done.stderr[-3000:]
    assert "sent 2, failed 2, pending 0" in done.stdout
    assert _sent(tenant["id"]) == [0, 3]
    listed = subprocess.run([sys.executable, "-m", "django", "herald_relay", "--failed"], cwd=ROOT,
                            env=_env(platform_db), capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.strip().splitlines()
    assert len(lines) == 2
    assert "tenant=nobody-at-all" in lines[0] and "'status': 404" in lines[0] and "not_found" in lines[0]
    assert "tenant=-" in lines[1] and "tenant_required" in lines[1]


def test_sent_rows_are_deleted_a_day_after_they_were_sent(platform_db, platform, server):  # noqa: F811
    (tenant,) = _tenants(platform, 1)
    _platform(platform_db, {"reset": True})
    ids = _platform(platform_db, {"rows": _rows([tenant], 4)})
    assert _relay_once(platform_db, server.url, platform.token).returncode == 0
    assert _platform(platform_db, {"age_sent": 86400 + 60, "ids": ids[:2]}) == [2]
    assert _platform(platform_db, {"age_sent": 86400 - 600, "ids": ids[2:3]}) == [1]

    assert _relay_once(platform_db, server.url, platform.token).returncode == 0  # it prunes as it ends

    assert _outbox(platform_db) == {"sent": 2}  # the day-old two went; the one sent 23 h ago stays
    assert _sent(tenant["id"]) == [0, 1, 2, 3]


def test_the_celery_task_on_the_platforms_own_worker_and_beat_sends_what_is_committed(platform_db, platform, server,  # noqa: F811
                                                                                  tmp_path):
    """The relay as a platform that runs Celery runs it: its beat sends the task by name on a schedule, its
    worker runs it (tests/platform_project/celery_app.py), over Redis; rows committed meanwhile arrive once,
    in order, and a rolled-back transaction's never."""
    (tenant,) = _tenants(platform, 1)
    _platform(platform_db, {"reset": True})
    env = {**_env(platform_db, server.url, platform.token), "PLATFORM_BROKER_URL": "redis://127.0.0.1:6379/9",
           "PLATFORM_QUEUE": f"platform-{uuid.uuid4().hex[:8]}"}
    celery = [str(ROOT / ".venv" / "bin" / "celery"), "-A", "tests.platform_project.celery_app"]
    worker = Process("platform-worker", [*celery, "worker", "--loglevel", "INFO", "--concurrency", "1", "--pool",
                                         "threads", "--without-gossip", "--without-mingle"], env, ready="ready.",
                     timeout=60)
    beat = Process("platform-beat", [*celery, "beat", "--loglevel", "INFO", "--schedule",
                                     str(tmp_path / "beat-schedule")], env, ready="beat: Starting", timeout=60)
    try:
        _platform(platform_db, {"rows": _rows([tenant], 9, rollback_every=5), "per_transaction": 3})
        committed = _committed(_rows([tenant], 9, rollback_every=5), 3, tenant)
        assert committed == [0, 1, 2, 6, 7, 8]
        wait_until(lambda: len(_sent(tenant["id"])) >= len(committed), timeout=60, message="the task's sending")
        assert _sent(tenant["id"]) == committed
        wait_until(lambda: re.search(r"Task herald_client\.django\.tasks\.relay_outbox\[[^]]+\] succeeded",
                                     worker.output()), timeout=30, message="the worker's run of the task")
        assert "Sending due task herald-outbox" in beat.output()
    finally:
        beat.stop()
        worker.stop()
    assert _outbox(platform_db) == {"sent": 6}


def test_a_relay_killed_at_random_moments_leaves_exactly_one_event_per_committed_row(platform_db, platform, server):  # noqa: F811
    tenants = _tenants(platform, 2)
    _platform(platform_db, {"reset": True})
    expected: dict[str, list[int]] = {tenant["id"]: [] for tenant in tenants}
    published = 0

    def publish_more(per_tenant: int) -> None:
        # the platform goes on writing: transactions of three rows, every seventh row's transaction rolled back
        nonlocal published
        rows = [{**row, "n": row["n"] + published} for row in _rows(tenants, per_tenant, rollback_every=7)]
        _platform(platform_db, {"rows": rows, "per_transaction": 3})
        for tenant in tenants:
            expected[tenant["id"]].extend(_committed(rows, 3, tenant))
        published += per_tenant

    def all_sent() -> bool:
        return all(len(_sent(tenant_id)) == len(ns) for tenant_id, ns in expected.items())

    publish_more(400)
    # small batches: more POSTs, so more kills land before, during and after one, and mid-batch
    kills, killed_with_rows_left, killed_before_sending, replayed, started = 0, 0, 0, 0, time.monotonic()
    while kills < KILLS:
        assert time.monotonic() - started < KILL_SECONDS, f"only {kills} of {KILLS} kills in {KILL_SECONDS:.0f} s"
        if all_sent():
            publish_more(100)
        events_before = Event.objects.filter(tenant_id__in=expected).count()
        # the input: when the relay is killed (before, during, after a POST): one kill in five while it is
        # still starting (before any POST), the others up to 0.3 s after it is up
        starting = random.random() < 0.2
        relay = _relay(platform_db, server.url, platform.token, "--batch-size", "7", name=f"relay-{kills}",
                       wait=not starting)
        time.sleep(random.uniform(0.0, 0.3))
        relay.kill()
        relay.stop()
        kills += 1
        killed_with_rows_left += not all_sent()
        # Herald made no event while this relay lived: it died before its first POST was taken
        killed_before_sending += Event.objects.filter(tenant_id__in=expected).count() == events_before
        replayed += sum(r for _, r in _rounds(relay.output()))
    total = sum(map(len, expected.values()))

    done = _relay_once(platform_db, server.url, platform.token, "--batch-size", "7")
    assert done.returncode == 0, done.stderr[-3000:]
    replayed += sum(r for _, r in _rounds(done.stdout))
    print(f"{platform_db.split(':')[0]}: killed the relay {kills} times in {time.monotonic() - started:.0f} s, "
          f"{killed_with_rows_left} of them with rows still unsent, {killed_before_sending} before Herald took "
          f"any of its POSTs; {replayed} rows answered by replay; {total} committed rows")
    assert killed_with_rows_left >= 10, "the relay was rarely killed with work left: the test proves little"
    # some kills came after Herald had taken a batch and before the relay had marked its rows (during or just
    # after the POST): the next relay sent the batch again under its key and got Herald's stored answer
    assert replayed >= 1, "no kill landed between Herald's answer and the rows' update: the test proves little"
    assert killed_before_sending >= 1, "no kill came before Herald took the relay's first POST"
    for tenant_id, ns in expected.items():
        assert _sent(tenant_id) == ns  # every committed row exactly once, in order
    assert _outbox(platform_db) == {"sent": total}


def test_herald_stopped_and_started_again_everything_arrives_in_order(platform_db, platform, processes):
    tenants = _tenants(platform, 2)
    _platform(platform_db, {"reset": True})
    port = free_port()
    herald = processes(gunicorn(port, workers=1, threads=4))
    relay = processes(_relay(platform_db, herald.url, platform.token))
    first = _rows(tenants, 50)
    _platform(platform_db, {"rows": first, "per_transaction": 5})
    wait_until(lambda: all(len(_sent(t["id"])) == 50 for t in tenants), timeout=60, message="the first rows sent")

    herald.stop()
    later = [{**row, "n": row["n"] + 50} for row in _rows(tenants, 100)]
    _platform(platform_db, {"rows": later, "per_transaction": 4})
    # Herald stays down until the relay has tried it again and again, backing off each time (up to its 1 s)
    wait_until(lambda: len(re.findall(r"no answer from Herald.*retrying in", relay.output())) >= HERALD_DOWN_TRIES,
               timeout=60, message=f"the relay failing to reach Herald {HERALD_DOWN_TRIES} times")
    assert all(len(_sent(t["id"])) == 50 for t in tenants)
    assert _outbox(platform_db) == {"sent": 100, "pending": 200}
    herald = processes(gunicorn(port, workers=1, threads=4))

    wait_until(lambda: all(len(_sent(t["id"])) == 150 for t in tenants), timeout=90, message="every row sent")
    for tenant in tenants:
        assert _sent(tenant["id"]) == list(range(150))
    assert relay.alive()


def test_two_relays_at_once_send_each_row_once(platform_db, platform, server, processes):  # noqa: F811
    tenants = _tenants(platform, 3)
    _platform(platform_db, {"reset": True})
    relays = [processes(_relay(platform_db, server.url, platform.token, "--batch-size", "20", name=f"relay-{n}"))
              for n in range(2)]
    rows = _rows(tenants, 300)
    _platform(platform_db, {"rows": rows, "per_transaction": 3})

    wait_until(lambda: all(len(_sent(t["id"])) >= 300 for t in tenants), timeout=120, message="every row sent")
    wait_until(lambda: _outbox(platform_db) == {"sent": 900}, timeout=30, message="every row marked sent")
    for tenant in tenants:
        assert _sent(tenant["id"]) == list(range(300))
    sqlite = platform_db.startswith("sqlite")

    def reported() -> tuple[list[int], list[int]]:
        rounds = [_rounds(relay.output()) for relay in relays]
        return [sum(sent for sent, _ in r) for r in rounds], [sum(replayed for _, replayed in r) for r in rounds]

    def every_row_reported() -> bool:
        # a relay prints its round after the round's commit: the rows can be marked sent a moment before the
        # line that counts them is written (one round can be hundreds of rows)
        sent_by, replayed_by = reported()
        return sum(sent_by) - (sum(replayed_by) if sqlite else 0) >= 900

    wait_until(every_row_reported, timeout=10, message="the relays' rounds reporting 900 rows")
    sent_by, replayed_by = reported()
    print(f"{platform_db.split(':')[0]}: rows sent by each relay {sent_by}, of them answered by replay {replayed_by}")
    assert all(relay.alive() for relay in relays)
    assert all(sent_by), (sent_by, replayed_by)   # both took part, else this proved one relay
    if sqlite:
        # no row locks: a batch both relays send is marked sent by both, the second time on Herald's replay
        assert sum(sent_by) - sum(replayed_by) == 900, (sent_by, replayed_by)
    else:
        # row locks: each row marked sent once, by one relay, and no batch posted by two relays at once. A batch
        # is posted again only after a transient failure a relay reported (Herald's answer lost under load, or
        # its own commit failing after Herald's: rolled back, so not marked): the other relay, or the same one,
        # then gets Herald's replay, not a second event (each row made one event: above).
        assert sum(sent_by) == 900, (sent_by, replayed_by)
        outputs = "".join(relay.output() for relay in relays)
        assert not sum(replayed_by) or "retrying in" in outputs, outputs[-3000:]


def test_throttled_and_unavailable_answers_are_waited_out_as_herald_says(platform_db, platform, processes):
    """Herald's 429 `throttled` (INTAKE_RATE_LIMIT_PER_SECOND) and 503 `database_unavailable` (its database
    unreachable) are transient: the relay waits the `Retry-After` they carry, not its own back-off, keeps
    the rows pending and their order, and sends each exactly once when Herald takes them."""
    (tenant,) = _tenants(platform, 1)
    _platform(platform_db, {"reset": True})
    _platform(platform_db, {"rows": _rows([tenant], 6), "per_transaction": 3})

    # throttled: one request a second for the platform's credential, each row a request of its own
    throttled = processes(gunicorn(free_port(), workers=1, threads=4, INTAKE_RATE_LIMIT_PER_SECOND="1"))
    relay = processes(_relay(platform_db, throttled.url, platform.token, "--batch-size", "1", "--max-backoff", "30",
                             name="relay-throttled"))
    wait_until(lambda: len(_sent(tenant["id"])) == 6, timeout=90, message="every row through the rate limit")
    assert _sent(tenant["id"]) == list(range(6))
    waits = re.findall(r"429 throttled; retrying in ([0-9.]+) s", relay.output())
    assert waits and {float(w) for w in waits} == {1.0}, relay.output()[-2000:]   # Retry-After: 1
    relay.stop()
    throttled.stop()

    # unavailable: the API is up, its database is not (a port nothing listens on)
    port = free_port()
    unreachable = f"postgres://127.0.0.1:{free_port()}/nowhere"
    down = processes(gunicorn(port, workers=1, threads=4, DATABASE_URL=unreachable, DATABASE_CONNECT_TIMEOUT="1"))
    more = [{**row, "n": row["n"] + 6} for row in _rows([tenant], 6)]
    _platform(platform_db, {"rows": more, "per_transaction": 3})
    relay = processes(_relay(platform_db, down.url, platform.token, "--max-backoff", "30", name="relay-down"))
    wait_until(lambda: len(re.findall(r"503 database_unavailable; retrying in 2\.00 s", relay.output())) >= 2,
               timeout=60, message="the relay waiting out Herald's 503 as its Retry-After says (2 s)")
    assert len(_sent(tenant["id"])) == 6 and _outbox(platform_db) == {"sent": 6, "pending": 6}
    down.stop()
    processes(gunicorn(port, workers=1, threads=4))   # Herald's database back, on the same address
    wait_until(lambda: len(_sent(tenant["id"])) == 12, timeout=60, message="the rows sent once Herald serves")
    assert _sent(tenant["id"]) == list(range(12))
    wait_until(lambda: _outbox(platform_db) == {"sent": 12}, timeout=30, message="every row marked sent")


def test_the_example_shop_sends_a_committed_payment_once_and_a_rolled_back_one_never(server, api, tmp_path):  # noqa: F811
    shop = ROOT / "examples" / "django_outbox"
    env = {key: value for key, value in os.environ.items() if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    env.update({"SHOP_DATABASE": str(tmp_path / "shop.sqlite3"), "HERALD_API_URL": server.url,
                "HERALD_TOKEN": api.token})

    def manage(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=shop, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    manage("migrate")
    assert "outbox row 1 will be sent" in manage("pay_invoice", "in_1").stdout
    assert "rolled back" in manage("pay_invoice", "in_2", "--fail").stderr
    assert "sent 1, failed 0, pending 0" in manage("herald_relay", "--once").stdout
    assert "sent 0, failed 0, pending 0" in manage("herald_relay", "--once").stdout
    events = list(Event.objects.filter(tenant=api.tenant))
    assert [(event.type, event.data) for event in events] == [("invoice.paid", {"invoice": "in_1", "amount": 1200})]
