"""What the browser tests share: Debian's Chromium for Playwright, and the whole system as deployed."""
import time
from pathlib import Path

import pytest

from tests.processes import celery_beat, celery_worker, free_port, gunicorn

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
INSTALL_LOG = Path("/tmp/chromium-install.log")  # written by a background `apt-get install chromium`, if any


def chromium_ready(timeout: float = 900) -> Path:
    """Wait for a background Chromium install to say `done`; fail (never skip) if there is no browser."""
    deadline = time.monotonic() + timeout
    while INSTALL_LOG.exists() and time.monotonic() < deadline:
        if any(line.strip() == "done" for line in INSTALL_LOG.read_text(errors="replace").splitlines()):
            break
        time.sleep(2)
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: this test needs Debian's Chromium "
                    "(`apt-get install -y chromium`)", pytrace=False)
    return CHROMIUM


@pytest.fixture
def herald(django_db_setup):
    """The whole system as deployed: gunicorn (pages + static files), a Celery worker, and beat."""
    processes = []
    try:
        processes.append(celery_worker("browser", concurrency=4))
        processes.append(celery_beat())
        server = gunicorn(free_port(), workers=2)
        processes.append(server)
        yield server
    finally:
        for process in reversed(processes):
            process.stop()
