"""Test settings: the project's settings with a private Celery queue and Redis database.

Values go through the environment, so worker and server subprocesses started by tests inherit them.
"""
import os
import secrets

# Under pytest-xdist (scripts/test runs the suite in three processes) each worker gets its own queue and Redis
# database, so that one test's FLUSHDB or purge never reaches another's; the processes a test starts inherit
# them. The controller and a plain run keep database 15.
_xdist_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _xdist_worker and os.environ.get("HERALD_TEST_WORKER") != _xdist_worker:
    os.environ["HERALD_TEST_WORKER"] = _xdist_worker
    os.environ["HERALD_QUEUE"] = f"herald-test-{os.getpid()}"
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:6379/{14 - int(_xdist_worker.removeprefix('gw')) % 14}"
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("HERALD_QUEUE", f"herald-test-{os.getpid()}")
os.environ.setdefault("WEBHOOK_ALLOW_PRIVATE_NETWORKS", "true")  # receivers in tests live on 127.0.0.1
os.environ.setdefault("WEBHOOK_RETRY_SCHEDULE", "1,1,1")
os.environ.setdefault("WEBHOOK_RETRY_JITTER", "0")
os.environ.setdefault("WEBHOOK_TIMEOUT_SECONDS", "2")
os.environ.setdefault("WEBHOOK_LEASE_SECONDS", "4")
os.environ.setdefault("WEBHOOK_DISPATCH_INTERVAL_SECONDS", "0.5")
os.environ.setdefault("WEBHOOK_REDISPATCH_AFTER_SECONDS", "2")
os.environ.setdefault("WEBHOOK_WORKER_HEARTBEAT_SECONDS", "1")  # a stopped worker is not live after 3 s
os.environ.setdefault("DEBUG", "false")
# DEBUG off: Herald's processes refuse to start without a key of their own (config/startup.py).
os.environ.setdefault("SECRET_KEY", "herald-tests-" + secrets.token_urlsafe(32))

from config.settings import *  # noqa: E402,F403

# One test database per pytest run, so that two runs on one machine never drop each other's.
DATABASES["default"]["TEST"] = {"NAME": f"test_herald_{os.getpid()}"}  # noqa: F405
