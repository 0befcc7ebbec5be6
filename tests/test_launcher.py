"""The quick start as a new user lives it: scripts/up, paste the printed curl, see the delivery."""
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time

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
    log = tempfile.NamedTemporaryFile(prefix="up-", suffix=".log", dir=RUN_DIR, delete=False)
    up = subprocess.Popen(["scripts/up"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                          start_new_session=True)
    output = lambda: open(log.name, errors="replace").read()  # noqa: E731
    try:
        wait_until(lambda: "Booting worker" in output() and "ready." in output() and "receiving webhooks" in output(),
                   timeout=90, message="scripts/up to start web, worker and receiver")
        post_curl, list_curl, portal_curl = [line.strip() for line in output().splitlines()
                                             if line.strip().startswith("curl ")]

        # the user pastes the first curl into a shell
        event = subprocess.run(["bash", "-c", post_curl], capture_output=True, text=True, check=True).stdout
        event_id = re.search(r'"id":"(evt_[^"]+)"', event).group(1)

        def delivered():
            listing = subprocess.run(["bash", "-c", list_curl], capture_output=True, text=True).stdout
            return event_id in listing and '"status":"succeeded"' in listing

        wait_until(delivered, timeout=30, message="the demo delivery to succeed")
        # the demo receiver verified the signature and printed the event, prefixed with its name
        assert re.search(rf"receiver\.\d+\s+\| {event_id} invoice.paid", output())
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        # the third opens the demo tenant's portal, where the demo endpoint and its delivery show
        link = json.loads(subprocess.run(["bash", "-c", portal_curl], capture_output=True, text=True,
                                         check=True).stdout)["url"]
        portal = requests.Session()
        shown = portal.get(link, timeout=10).text
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', shown).group(1)
        opened = portal.post(link, data={"csrfmiddlewaretoken": csrf}, headers={"Referer": link}, timeout=10)
        assert opened.url.endswith("/portal/")
        assert event_id in portal.get(f"http://127.0.0.1:{port}/portal/deliveries", timeout=10).text
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
    # Ctrl-C stopped every process it started
    time.sleep(0.5)
    leftovers = subprocess.run(["pgrep", "-g", str(up.pid)], capture_output=True, text=True).stdout.split()
    assert leftovers == [], shlex.join(leftovers)
