"""gunicorn.conf.py's control socket: two Herald APIs run as the same user (tests, a second instance on one
host) without taking over or removing each other's. Real gunicorn processes, each with the repository's
gunicorn.conf.py, under a throwaway home directory."""
import pytest
import requests
from gunicorn.ctl.client import ControlClient

from tests.conftest import wait_until
from tests.processes import free_port, gunicorn

pytestmark = pytest.mark.django_db(transaction=True)


def _serves(server) -> bool:
    try:
        return requests.get(f"{server.url}/healthz", timeout=10).status_code in (200, 503)
    except requests.ConnectionError:
        return False


def test_by_default_no_instance_opens_the_users_one_control_socket(processes, tmp_path):
    # given two instances of the same user, whose default control socket would be ~/.gunicorn/gunicorn.ctl
    home = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": ""}
    first = processes(gunicorn(free_port(), workers=1, threads=1, **home))
    second = processes(gunicorn(free_port(), workers=1, threads=1, **home))
    # (each arbiter opens its control socket right after forking its workers: long before they serve)
    wait_until(lambda: _serves(first) and _serves(second), message="both serving")
    # then neither made it (the second would have replaced the first's, and removed it on exit)
    assert not (tmp_path / ".gunicorn" / "gunicorn.ctl").exists()
    second.stop()
    assert _serves(first)
    assert "control socket" not in first.output().lower()


def test_with_a_path_each_instance_keeps_its_own_socket(processes, tmp_path):
    sockets = [tmp_path / "a.ctl", tmp_path / "b.ctl"]
    first, second = (processes(gunicorn(free_port(), workers=1, threads=1, HOME=str(tmp_path), XDG_RUNTIME_DIR="",
                                        GUNICORN_CONTROL_SOCKET=str(path))) for path in sockets)
    wait_until(lambda: all(path.is_socket() for path in sockets), message="both control sockets")
    second.stop()
    assert sockets[0].is_socket() and not sockets[1].exists()
    with ControlClient(str(sockets[0]), timeout=10) as client:
        workers = client.send_command("show workers")
    assert len(workers["workers"]) == 1, workers
    assert _serves(first)
