"""The API while its database cannot serve: 503 `database_unavailable` with Retry-After, never a 500 (SPEC §5);
and a multi-host DATABASE_URL, which is how Herald follows a PostgreSQL failover (config/database_url.py).

The failover itself, under load with pg_auto_failover, is the black-box scenario `database-failover`."""
import psycopg
import pytest
import requests
from django.db import connection

from config.database_url import database_settings
from tests.conftest import subprocess_env, wait_until
from tests.processes import free_port, gunicorn, warm

pytestmark = pytest.mark.django_db(transaction=True)


def _test_database() -> tuple[str, str]:
    settings = connection.settings_dict
    return settings.get("USER") or "", settings["NAME"]


def test_a_multi_host_url_is_read_by_libpq_and_a_one_host_url_as_before():
    many = database_settings("postgres://app:s%40cret@10.0.0.1:5433,10.0.0.2:5434/herald"
                             "?target_session_attrs=read-write&sslmode=require", conn_max_age=60)
    assert (many["HOST"], many["PORT"], many["NAME"], many["USER"], many["PASSWORD"]) == (
        "10.0.0.1,10.0.0.2", "5433,5434", "herald", "app", "s@cret")
    assert many["OPTIONS"] == {"target_session_attrs": "read-write", "sslmode": "require"}
    assert many["CONN_MAX_AGE"] == 60 and many["CONN_HEALTH_CHECKS"] is True
    one = database_settings("postgres://app@db:5432/herald", conn_max_age=60)
    assert (one["HOST"], one["PORT"], one["NAME"]) == ("db", 5432, "herald")


def test_the_api_serves_from_the_host_that_accepts_writes(api, processes):
    # the first host refuses connections (a primary that died); libpq goes on to the next
    user, name = _test_database()
    closed = free_port()
    url = (f"postgres://{user}@127.0.0.1:{closed},127.0.0.1:{connection.settings_dict.get('PORT') or 5432}/{name}"
           "?target_session_attrs=read-write")
    web = warm(processes(gunicorn(free_port(), workers=1, threads=2, DATABASE_URL=url)))
    answer = requests.post(f"{web.url}/api/v1/events", json={"type": "invoice.paid", "data": {}},
                           headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": "failover-key-1"})
    assert answer.status_code == 202, answer.text


def _unavailable(answer: requests.Response) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert answer.json()["code"] == "database_unavailable"
    assert int(answer.headers["Retry-After"]) > 0


def test_with_no_database_every_call_is_503_with_retry_after(api, processes):
    user, name = _test_database()
    url = f"postgres://{user}@127.0.0.1:{free_port()}/{name}"
    web = processes(gunicorn(free_port(), workers=1, threads=2, DATABASE_URL=url, DATABASE_CONNECT_TIMEOUT="2"))
    wait_until(lambda: _answers(web.url), 30, message="gunicorn to answer")
    auth = {"Authorization": f"Bearer {api.token}"}
    _unavailable(requests.post(f"{web.url}/api/v1/events", json={"type": "invoice.paid", "data": {}},
                               headers={**auth, "Idempotency-Key": "failover-key-2"}))
    _unavailable(requests.get(f"{web.url}/api/v1/endpoints", headers=auth))
    health = requests.get(f"{web.url}/healthz")
    assert health.status_code == 503 and health.json()["database"] != "ok"


def _answers(url: str) -> bool:
    try:
        requests.get(f"{url}/healthz", timeout=5)
        return True
    except requests.ConnectionError:
        return False


def test_a_database_lost_while_serving_is_503_then_served_again(api, processes):
    web = warm(processes(gunicorn(free_port(), workers=1, threads=2, DATABASE_CONNECT_TIMEOUT="2")))
    auth = {"Authorization": f"Bearer {api.token}"}
    assert requests.get(f"{web.url}/api/v1/endpoints", headers=auth).status_code == 200
    settings = connection.settings_dict
    name, own = settings["NAME"], connection.cursor().connection.info.backend_pid
    admin = psycopg.connect(host=settings.get("HOST") or "127.0.0.1", port=settings.get("PORT") or 5432,
                            user=settings.get("USER") or None, dbname="postgres", autocommit=True)
    with admin:
        # as a failing primary does: its sessions are cut, and it takes no new ones
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                          [name, own])
            _unavailable(requests.post(f"{web.url}/api/v1/events", json={"type": "invoice.paid", "data": {}},
                                       headers={**auth, "Idempotency-Key": "failover-key-3"}))
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    # the client's retry with the same key executes: the failed request left no key behind
    answer = requests.post(f"{web.url}/api/v1/events", json={"type": "invoice.paid", "data": {}},
                           headers={**auth, "Idempotency-Key": "failover-key-3"})
    assert answer.status_code == 202, answer.text
    assert "Idempotent-Replay" not in answer.headers
