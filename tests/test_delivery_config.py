"""Celery and delivery settings, as a production process with default settings sees them."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json
from config.celery import app
from django.conf import settings
c = app.conf
print(json.dumps({
    "acks_late": c.task_acks_late,
    "prefetch": c.worker_prefetch_multiplier, "soft": c.task_soft_time_limit, "hard": c.task_time_limit,
    "ack_emulation": c.broker_transport_options.get("ack_emulation", True), "serializer": c.task_serializer,
    "accept": c.accept_content, "timeout": settings.WEBHOOK_TIMEOUT_SECONDS,
    "lease": settings.WEBHOOK_LEASE_SECONDS, "interval": settings.WEBHOOK_DISPATCH_INTERVAL_SECONDS,
    "redispatch": settings.WEBHOOK_REDISPATCH_AFTER_SECONDS,
    "beat": {name: entry["task"] for name, entry in c.beat_schedule.items()},
    "beat_dispatch_every": c.beat_schedule["dispatch-due-deliveries"]["schedule"],
    "beat_prune_every": c.beat_schedule["prune-idempotency-keys"]["schedule"],
    "beat_retention_every": c.beat_schedule["prune-events"]["schedule"], "retention_days": settings.EVENT_RETENTION_DAYS,
    "retention_queue": c.task_routes["webhooks.prune_events"]["queue"], "periodic": settings.HERALD_PERIODIC_QUEUE,
    "prune_batch": settings.IDEMPOTENCY_PRUNE_BATCH,
    "queue": c.task_default_queue, "pool": c.worker_pool, "concurrency": c.worker_concurrency,
    "cap": settings.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT, "breaker": settings.WEBHOOK_BREAKER_FAILURES,
    "cooldown": settings.WEBHOOK_BREAKER_COOLDOWN_SECONDS, "db_pool": settings.WEBHOOK_WORKER_DB_POOL_SIZE,
}))
"""


def _defaults() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBHOOK_", "IDEMPOTENCY_", "HERALD_"))}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    script = "import django, os; django.setup()\n" + PROBE
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_durability_settings_and_recovery_bounds_with_the_defaults():
    conf = _defaults()
    # PostgreSQL holds the durability: tasks are acknowledged when taken, a worker reserves one per thread
    assert conf["acks_late"] is False and conf["prefetch"] == 1
    assert conf["serializer"] == "json" and conf["accept"] == ["json"]
    # time limits sit between the attempt's deadline and the lease's end, so no second worker can claim
    # a delivery whose attempt may still run; Redis keeps no copy of a message it handed out (PostgreSQL
    # and the dispatcher recover a lost one)
    assert conf["timeout"] == 15 and conf["timeout"] < conf["soft"] < conf["hard"] < conf["lease"]
    assert conf["ack_emulation"] is False
    # SPEC §6: a dead worker's delivery is sent again within 2 x timeout + 30 s ...
    assert conf["lease"] + conf["interval"] <= 2 * conf["timeout"] + 30
    # ... and a lost task is enqueued again within 60 s
    assert conf["redispatch"] + conf["interval"] <= 60
    assert conf["beat"] == {"dispatch-due-deliveries": "webhooks.dispatch_due",
                            "prune-idempotency-keys": "intake.prune_idempotency_keys",
                            "disable-failing-endpoints": "webhooks.disable_failing_endpoints",
                            "prune-events": "webhooks.prune_events", "erase-tenants": "intake.erase_tenants"}
    assert conf["beat_dispatch_every"] == 5 and conf["beat_prune_every"] == 3600 and conf["prune_batch"] == 5000
    # SPEC §7: retention daily or more often, 30 days by default, beside the other periodic tasks
    assert conf["beat_retention_every"] <= 86400 and conf["retention_days"] == 30
    assert conf["retention_queue"] == conf["periodic"]


def test_the_default_worker_is_100_threads_with_isolation_on():
    conf = _defaults()
    assert (conf["pool"], conf["concurrency"], conf["db_pool"]) == ("threads", 100, 10)
    assert (conf["cap"], conf["breaker"], conf["cooldown"]) == (10, 5, 30)


def test_a_lease_shorter_than_the_timeout_is_refused():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "WEBHOOK_TIMEOUT_SECONDS": "15",
           "WEBHOOK_LEASE_SECONDS": "10"}
    out = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert "WEBHOOK_LEASE_SECONDS must be longer than WEBHOOK_TIMEOUT_SECONDS" in out.stderr
