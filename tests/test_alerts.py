"""The alert rules and the dashboard in deploy/: promtool's unit tests, and a real Prometheus scraping a live
Herald (gunicorn, a worker and beat) that fires the alerts of an induced fault."""
import os
import re
import secrets
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import requests
import yaml
from django.db.models import F
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests import dashboard
from tests.conftest import wait_until
from tests.processes import ROOT, celery_beat, celery_worker, free_port, gunicorn, prometheus, run_dir
from tests.receiver import Answer
from webhooks.models import DISPATCHER, DeliveryOutbox, Heartbeat

RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "herald-rules.yml"
ALERTS = [rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=60)


def test_the_rules_are_valid_and_pass_their_promtool_unit_tests():
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout
    tested = _promtool("test", "rules", "herald-rules.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
    # every alert has a test that sees it fire
    tests = yaml.safe_load((RULES_DIR / "herald-rules.test.yml").read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert fired == set(ALERTS)


@pytest.mark.django_db
def test_the_rules_and_the_dashboard_name_only_metrics_herald_exports():
    Heartbeat.objects.create(name=DISPATCHER, at=timezone.now())  # its gauge is absent until the dispatcher runs
    exported = set()
    for family in text_string_to_metric_families(Client().get("/metrics").content.decode()):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}.get(family.type, ("",))
        exported |= {family.name + suffix for suffix in suffixes}
    texts = RULES.read_text() + "".join(target["expr"] for panel in dashboard.panels(dashboard.load())
                                        for target in panel["targets"])
    used = set(re.findall(r"\bherald_[a-z_]+", texts))
    assert used and used <= exported, used - exported


def _scaled_rules(path: Path) -> None:
    """The rules as shipped, their `for:` durations a sixtieth as long (a minute becomes a second), so that the
    test does not wait minutes; expressions and thresholds are untouched."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                amount, unit = re.fullmatch(r"(\d+)([smh])", rule["for"]).groups()
                rule["for"] = f"{max(1, int(amount) * {'s': 1, 'm': 60, 'h': 3600}[unit] // 60)}s"
    path.write_text(yaml.safe_dump(rules))


def _alerts(prom) -> dict[str, str]:
    """alertname -> state (pending, firing) of every active alert."""
    body = requests.get(f"{prom.url}/api/v1/alerts", timeout=5).json()
    return {alert["labels"]["alertname"]: alert["state"] for alert in body["data"]["alerts"]}


def _value(prom, expr: str) -> float | None:
    result = dashboard.query(prom.url, expr)["result"]
    return float(result[0]["value"][1]) if result else None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_prometheus_fires_the_alerts_of_a_stopped_worker_with_deliveries_due(api, receiver):
    started = time.monotonic()
    token = "scrape-" + secrets.token_hex(8)
    env = {"PROMETHEUS_MULTIPROC_DIR": str(run_dir("metrics")), "METRICS_TOKEN": token}
    # two receivers: one that works, one that answers 500 (its breaker trips; its attempts fail)
    receiver.script("/broken", *[Answer(500)] * 2000)
    for path in ("/ok", "/broken"):
        assert api.post("endpoints", {"url": receiver.url(path)}).status_code == 201
    config_dir = run_dir("prometheus-config")
    _scaled_rules(config_dir / "rules.yml")
    web = gunicorn(free_port(), workers=1, threads=2, **env)
    processes = [web]
    try:
        # (the broken receiver's breaker never trips here, so that it keeps failing attempts: enough of them for
        # the alert's least volume, 30 in 10 minutes)
        worker = celery_worker("alerts", concurrency=10, WEBHOOK_BREAKER_FAILURES=1000, **env)
        processes += [worker, celery_beat()]
        host, port = web.url.removeprefix("http://").split(":")
        (config_dir / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(config_dir / "rules.yml")],
            "scrape_configs": [{"job_name": "herald", "static_configs": [{"targets": [f"{host}:{port}"]}],
                                "authorization": {"credentials": token}}],
        }))
        prom = prometheus(config_dir / "prometheus.yml", free_port())
        processes.append(prom)

        def post(count: int) -> None:
            for _ in range(count):
                response = requests.post(f"{web.url}/api/v1/events", json={"type": "invoice.paid", "data": {}},
                                         headers={"Authorization": f"Bearer {api.token}",
                                                  "Idempotency-Key": secrets.token_hex(8)}, timeout=10)
                assert response.status_code == 202, response.text

        # Herald at work: Prometheus sees the live worker, then the attempts (what happens before the first
        # scrape is in each counter's first sample, which rate() cannot count)
        wait_until(lambda: _value(prom, "herald_workers_live") == 1, timeout=20, message="a first scrape")
        post(12)
        receiver.wait_for(12, "/ok")
        receiver.wait_for(12 * 4, "/broken")  # the first attempt and the three retries of WEBHOOK_RETRY_SCHEDULE
        # (Prometheus scrapes first a few seconds after it starts, once its target discovery has reported: with
        # `for:` scaled down, HeraldMetricsAbsent may fire meanwhile; it must be gone once Herald is scraped)
        wait_until(lambda: _value(prom, "herald_workers_live") == 1
                   and (_value(prom, 'sum(herald_delivery_attempts_total{outcome="success"})') or 0) >= 12
                   and not {"HeraldWorkersAbsent", "HeraldDeliveriesDelayed", "HeraldMetricsAbsent"} & set(_alerts(prom)),
                   timeout=20, message="Prometheus to scrape the live worker and its attempts, with no alert for them")

        # For the picture in docs/operations.md (HERALD_DASHBOARD_PNG set): a minute of steady traffic first.
        picture = os.environ.get("HERALD_DASHBOARD_PNG")
        steady_until = time.monotonic() + (60 if picture else 0)
        while time.monotonic() < steady_until:
            post(1)
            time.sleep(0.4)  # the input: the traffic's pace

        # the fault: the only worker dies (SIGKILL: no goodbye), and events keep coming, due now; the rows are
        # set back ten minutes, as if it had been down that long
        worker.kill()
        post(3)
        DeliveryOutbox.objects.update(due_at=F("due_at") - timedelta(minutes=10))
        # and half the attempts to endpoints that worked within the hour failed (the broken receiver's)
        expected = ("HeraldWorkersAbsent", "HeraldDeliveriesDelayed", "HeraldDeliveriesFailing")
        deadline = time.monotonic() + 30
        while not all((fired := _alerts(prom)).get(name) == "firing" for name in expected):
            assert time.monotonic() < deadline, (fired, {expr: dashboard.query(prom.url, expr)["result"] for expr in (
                "herald_workers_live", "herald_oldest_due_delivery_age_seconds", "herald_delivery_attempts_total",
                'sum(rate(herald_delivery_attempts_total{endpoint_class!="down"}[10m]))')})
            time.sleep(0.5)
        assert _value(prom, "herald_workers_live") == 0
        assert _value(prom, "herald_oldest_due_delivery_age_seconds") > 600
        # the API answers, /metrics is scraped, the dispatcher ran seconds ago (its task runs on a worker: it
        # would stop a minute later): those stay quiet
        for quiet in ("HeraldDispatcherNotRunning", "HeraldMetricsAbsent", "HeraldIntakeErrors",
                      "HeraldBreakerTripsRising"):
            assert quiet not in fired, fired

        # every query of the dashboard is valid PromQL against this Prometheus, and the delivery panels have data
        empty = []
        for panel in dashboard.panels(dashboard.load()):
            for target in panel["targets"]:
                expr = dashboard.expand(target["expr"], job="herald", rate_interval="15s")
                if not dashboard.query(prom.url, expr)["result"]:
                    empty.append(panel["title"])
        assert not {"Live workers", "Oldest due delivery", "Pending deliveries", "Attempts by outcome",
                    "Failing attempts by endpoint class", "Attempt duration", "API responses by status",
                    "Intake by idempotency outcome", "Circuit breakers"} & set(empty), empty
        if picture:  # events keep coming for half a minute more, then the picture
            for _ in range(60):
                post(1)
                time.sleep(0.4)  # the input: the traffic's pace
            dashboard.render(prom.url, start=time.time() - (time.monotonic() - started), end=time.time(),
                             path=Path(picture), job="herald", scrape_seconds=1,
                             note="tests/test_alerts.py: a receiver answering 500, then the only worker killed")
    finally:
        for process in reversed(processes):
            process.stop()
    print(f"real Prometheus test: {time.monotonic() - started:.1f} s")
