"""The quick start as a new user lives it: scripts/up in a terminal, paste the printed curl, see the delivery."""
import json
import os
import pty
import re
import shlex
import signal
import subprocess
import tempfile
import threading

import pytest
import requests

from tests.conftest import subprocess_env, wait_until
from tests.processes import ROOT, RUN_DIR, free_port, run_dir

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_scripts_up_runs_everything_and_its_curl_produces_a_delivery():
    port, receiver_port = free_port(), free_port()
    data = str(run_dir("up-data"))
    env = subprocess_env(PORT=port, RECEIVER_PORT=receiver_port, HERALD_DATA_DIR=data,
                         DJANGO_SETTINGS_MODULE="config.settings", WEB_CONCURRENCY=1, WORKER_CONCURRENCY=1)
    env.pop("WEBHOOK_ALLOW_PRIVATE_NETWORKS")  # the launcher decides that for the demo
    env.pop("SECRET_KEY")  # and makes a key of its own (DEBUG is off: none, and nothing would start)
    env.pop("DEBUG", None)
    env.pop("HERALD_LOG_FORMAT", None)  # the launcher decides, from its own output: a terminal here
    log = tempfile.NamedTemporaryFile(prefix="up-", suffix=".log", dir=RUN_DIR, delete=False)
    # In a terminal, as a person runs it: its output is a pseudo-terminal, copied to the log as it comes.
    terminal, screen = pty.openpty()
    up = subprocess.Popen(["scripts/up"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=screen,
                          stderr=screen, start_new_session=True)
    os.close(screen)
    copier = threading.Thread(target=_copy, args=(terminal, log), daemon=True)
    copier.start()
    output = lambda: _ANSI.sub("", open(log.name, errors="replace").read()).replace("\r", "")  # noqa: E731
    try:
        wait_until(lambda: "Booting worker" in output() and "ready." in output() and "receiving webhooks" in output(),
                   timeout=90, message="scripts/up to start web, worker and receiver")
        post_curl, list_curl, portal_curl, tenant_curl, tenant_event_curl = [
            line.strip() for line in output().splitlines() if line.strip().startswith("curl ")]

        # the user pastes the first curl into a shell
        event = subprocess.run(["bash", "-c", post_curl], capture_output=True, text=True, check=True).stdout
        event_id = re.search(r'"id":"(evt_[^"]+)"', event).group(1)

        def delivered():
            listing = subprocess.run(["bash", "-c", list_curl], capture_output=True, text=True).stdout
            return event_id in listing and '"status":"succeeded"' in listing

        wait_until(delivered, timeout=30, message="the demo delivery to succeed")
        # the demo receiver verified the signature and printed the event, prefixed with its name
        assert re.search(rf"receiver\.\d+\s+\| {event_id} invoice.paid", output())
        health = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert health.status_code == 200
        # Short human log lines in a terminal (HERALD_LOG_FORMAT=console), no JSON, and beat's dispatcher
        # quiet while it has nothing to do, though it ticks (every 0.5 s here).
        logs = output()
        assert re.search(r"worker\.1\s+\| INFO celery\.apps\.worker: \S+ ready\.", logs), logs[-3000:]
        assert re.search(rf"worker\.1\s+\| INFO herald\.delivery: delivery\.attempt .*event_id={event_id}\b.*"
                         r"response_status=200 .*outcome=succeeded", logs), logs[-3000:]
        assert not re.search(r"\| \{\"", logs), "a JSON log line in the terminal"
        assert health.json()["dispatcher"]["last_run_age_seconds"] < 5, "the dispatcher ticks"
        assert "Sending due task dispatch-due-deliveries" not in logs
        assert not re.search(r"webhooks\.dispatch_due\[\S+\] (received|succeeded in \S+: 0\b)", logs)
        # the third opens the demo tenant's portal, where the demo endpoint and its delivery show
        link = json.loads(subprocess.run(["bash", "-c", portal_curl], capture_output=True, text=True,
                                         check=True).stdout)["url"]
        portal = requests.Session()
        shown = portal.get(link, timeout=10).text
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', shown).group(1)
        opened = portal.post(link, data={"csrfmiddlewaretoken": csrf}, headers={"Referer": link}, timeout=10)
        assert opened.url.endswith("/portal/")
        assert event_id in portal.get(f"http://127.0.0.1:{port}/portal/deliveries", timeout=10).text
        # the last two, with the platform token: a tenant for your own customer, and an event posted for it
        tenant = json.loads(subprocess.run(["bash", "-c", tenant_curl], capture_output=True, text=True,
                                           check=True).stdout)
        assert tenant["uid"] == "acme" and tenant["id"].startswith("tnt_")
        posted = subprocess.run(["bash", "-c", tenant_event_curl], capture_output=True, text=True, check=True).stdout
        assert re.search(r'"id":"evt_[^"]+"', posted), posted
        key_file = os.path.join(data, "secret_key")
        assert len(open(key_file).read().strip()) >= 50 and os.stat(key_file).st_mode & 0o077 == 0
    finally:
        os.killpg(up.pid, signal.SIGINT)  # Ctrl-C
        try:
            up.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            raise
    assert up.returncode is not None
    copier.join(10)
    # Ctrl-C stopped every process it started: its process group empties (a child may take a moment to exit
    # after honcho; one that stays is the failure)
    def leftovers() -> list[str]:
        return subprocess.run(["pgrep", "-g", str(up.pid)], capture_output=True, text=True).stdout.split()

    try:
        wait_until(lambda: not leftovers(), timeout=15, message="scripts/up's process group to empty")
    except AssertionError:
        raise AssertionError(shlex.join(leftovers())) from None


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # honcho colours each line's prefix in a terminal


def _copy(terminal: int, log) -> None:
    """Copy what the terminal shows into the log file until every process that held it has exited."""
    with open(log.name, "ab", buffering=0) as out:
        while True:
            try:
                data = os.read(terminal, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not data:
                break
            out.write(data)
    os.close(terminal)
