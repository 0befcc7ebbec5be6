"""Safe defaults: DEBUG off, no serving without a SECRET_KEY of one's own, a statement timeout for the web.

Each process is started as the README starts it, for real; none is mocked.
"""
import subprocess
import sys
import time

import pytest
import requests

from tests.conftest import make_api, other_session, subprocess_env
from tests.processes import BIN, ROOT, celery_worker, free_port, gunicorn
from webhooks.models import Event

pytestmark = pytest.mark.django_db(transaction=True)

PUBLISHED = "herald-compose-insecure-secret-key-set-SECRET_KEY-in-production"


def _env(**changes):
    env = subprocess_env(DJANGO_SETTINGS_MODULE="config.settings")
    for name in ("DEBUG", "SECRET_KEY"):
        env.pop(name, None)
    env.update(changes)
    return env


COMMANDS = {
    "web": [str(BIN / "gunicorn"), "config.wsgi", "--bind", "127.0.0.1:0"],
    "worker": [str(BIN / "celery"), "-A", "config", "worker", "--without-gossip", "--without-mingle"],
    "beat": [str(BIN / "celery"), "-A", "config", "beat", "--schedule", "/tmp/herald-refused-beat-schedule"],
}


@pytest.mark.parametrize("process", sorted(COMMANDS))
@pytest.mark.parametrize("secret_key", [None, PUBLISHED], ids=["missing", "published"])
def test_with_debug_off_a_process_refuses_to_start_on_a_missing_or_published_key(process, secret_key):
    env = _env() if secret_key is None else _env(SECRET_KEY=secret_key)
    result = subprocess.run(COMMANDS[process], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    reasons = [line for line in (result.stdout + result.stderr).splitlines() if "refusing to start" in line]
    assert len(reasons) >= 1 and reasons[0].startswith(f"herald {process}: refusing to start: SECRET_KEY")
    assert ("is not set" if secret_key is None else "published default") in reasons[0]


def test_debug_is_off_unless_set_and_then_the_development_key_is_allowed():
    probe = "from django.conf import settings as s; from config.startup import unsafe_reason; " \
            "print(s.DEBUG, unsafe_reason() is None)"
    for env, expected in ((_env(), "False False"), (_env(DEBUG="true"), "True True"),
                          (_env(SECRET_KEY="x" * 50), "False True")):
        result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=60)
        assert result.stdout.strip() == expected, result.stderr


def test_a_web_request_stuck_on_a_slow_statement_is_cut_and_changes_nothing(processes, broker):
    api = make_api("acme")
    server = processes(gunicorn(free_port(), WEB_STATEMENT_TIMEOUT_SECONDS="1"))
    blocker = other_session(autocommit=False)
    blocker.execute("LOCK TABLE webhooks_event IN ACCESS EXCLUSIVE MODE")  # any insert into it now waits
    headers = {"Authorization": f"Bearer {api.token}", "Idempotency-Key": "stuck-request-1"}
    try:
        started = time.monotonic()
        response = requests.post(f"{server.url}/api/v1/events", json={"type": "invoice.paid", "data": {}},
                                 headers=headers, timeout=20)
        took = time.monotonic() - started
    finally:
        blocker.close()
    assert response.status_code >= 500 and response.headers["Content-Type"] == "application/problem+json"
    assert took < 5, f"answered after {took:.1f} s"
    assert not Event.objects.exists()
    # the key was released: the client's retry with the same key now goes through
    retried = requests.post(f"{server.url}/api/v1/events", json={"type": "invoice.paid", "data": {}},
                            headers=headers, timeout=20)
    assert retried.status_code == 202 and Event.objects.count() == 1


def test_a_worker_says_as_it_starts_that_the_database_does_not_autovacuum(processes):
    """The check runs before the worker says `ready.`, so its line is there or not by then: there exactly when the
    server's autovacuum is off (this machine's setting decides which side a run sees; it is a server setting,
    not one a session can change)."""
    with other_session() as session:
        (autovacuum,) = session.execute("SHOW autovacuum").fetchone()
    worker = processes(celery_worker("vacuum-check"))
    assert ("database.autovacuum_off" in worker.output()) == (autovacuum == "off"), worker.output()[-2000:]
