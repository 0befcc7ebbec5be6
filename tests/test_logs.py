"""Log lines (config/logs.py, LOGGING in config/settings.py): JSON by default, a short human line with
HERALD_LOG_FORMAT=console, and beat's dispatcher quiet while it has nothing to do.

The console format in a real terminal, through scripts/up, is tests/test_launcher.py's."""
import io
import json
import logging
import logging.config
import re

import pytest
from celery.app import trace
from django.conf import settings

from tests.conftest import wait_until
from tests.processes import celery_beat, celery_worker
from webhooks.models import DISPATCHER, Heartbeat


@pytest.fixture
def configured(monkeypatch):
    """The project's LOGGING with one format, writing to a buffer; the test's own logging comes back after."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    buffer = io.StringIO()

    def configure(fmt: str) -> io.StringIO:
        config = json.loads(json.dumps(settings.LOGGING))
        config["handlers"]["console"].update(formatter=fmt, stream="ext://sys.stdout")
        monkeypatch.setattr("sys.stdout", buffer)
        logging.config.dictConfig(config)
        return buffer

    yield configure
    root.handlers, root.level = saved
    for name in ("celery.beat", "celery.app.trace", "celery.worker.strategy", "herald"):
        logging.getLogger(name).setLevel(logging.NOTSET if name != "herald" else logging.INFO)


def _celery_lines(task: str, result: str) -> None:
    """What beat and a worker log for one run of `task`, with Celery's own messages and `extra`s."""
    logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "entry", task)
    context = {"id": "c0ffee", "name": task, "args": "()", "kwargs": "{}", "eta": None}
    logging.getLogger("celery.worker.strategy").info(trace.LOG_RECEIVED, context, extra={"data": context})
    done = {**context, "return_value": result, "runtime": 0.01}
    logging.getLogger("celery.app.trace").info(trace.LOG_SUCCESS, done, extra={"data": done})


def test_the_console_format_is_one_short_line_with_the_fields_that_say_something(configured):
    out = configured("console")
    logging.getLogger("herald.delivery").info("delivery.attempt", extra={
        "delivery_id": "dlv_1", "attempt": 1, "response_status": 200, "error": "", "probe": False, "breaker": None,
        "ids": ["a", "b"], "reason": "two words"})
    logging.getLogger("celery.apps.worker").info("celery@host ready.")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("herald.engine").exception("engine.claim_failed", extra={"deliveries": 3})

    lines = out.getvalue().splitlines()
    assert lines[0] == ('INFO herald.delivery: delivery.attempt delivery_id=dlv_1 attempt=1 response_status=200 '
                        'ids=["a","b"] reason="two words"')
    assert lines[1] == "INFO celery.apps.worker: celery@host ready."
    assert lines[2] == "ERROR herald.engine: engine.claim_failed deliveries=3"
    assert lines[3] == "Traceback (most recent call last):" and lines[-1] == "RuntimeError: boom"


def test_json_is_the_default_and_idle_dispatcher_ticks_stay_out_of_it(configured):
    assert settings.HERALD_LOG_FORMAT == "json"
    out = configured(settings.HERALD_LOG_FORMAT)
    logging.getLogger().setLevel(logging.INFO)
    _celery_lines("webhooks.dispatch_due", "0")  # an idle tick: three lines at DEBUG, so none
    _celery_lines("webhooks.dispatch_due", "7")  # a tick that published 7 deliveries: its result shows
    _celery_lines("webhooks.prune_events", "0")  # every other task as before

    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["level"], line["message"]) for line in lines] == [
        ("INFO", "Task webhooks.dispatch_due[c0ffee] succeeded in 0.01s: 7"),
        ("INFO", "Scheduler: Sending due task entry (webhooks.prune_events)"),
        ("INFO", "Task webhooks.prune_events[c0ffee] received"),
        ("INFO", "Task webhooks.prune_events[c0ffee] succeeded in 0.01s: 0"),
    ]


def test_with_debug_on_the_idle_ticks_show_as_debug(configured):
    out = configured("console")
    logging.getLogger().setLevel(logging.DEBUG)
    _celery_lines("webhooks.dispatch_due", "0")
    assert out.getvalue().splitlines() == [
        "DEBUG celery.beat: Scheduler: Sending due task entry (webhooks.dispatch_due)",
        "DEBUG celery.worker.strategy: Task webhooks.dispatch_due[c0ffee] received",
        "DEBUG celery.app.trace: Task webhooks.dispatch_due[c0ffee] succeeded in 0.01s: 0",
    ]


def test_an_unknown_format_is_refused():
    import subprocess
    import sys

    from tests.processes import ROOT

    env = {"HERALD_LOG_FORMAT": "pretty", "DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "HERALD_LOG_FORMAT must be json or console" in result.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_processes_without_a_terminal_write_json_and_nothing_per_idle_tick(processes):
    worker = processes(celery_worker("logs"))
    beat = processes(celery_beat())
    from config.ops import dispatcher_age

    wait_until(lambda: (age := dispatcher_age()) is not None and age < 2, message="the dispatcher to run")
    # four more idle dispatcher runs, each seen as a new heartbeat; the worker runs one task at a time, so the
    # first three have logged all they would by the time the fourth writes its heartbeat
    seen = [Heartbeat.objects.get(name=DISPATCHER).at]

    def beats_seen() -> int:
        at = Heartbeat.objects.get(name=DISPATCHER).at
        if at != seen[-1]:
            seen.append(at)
        return len(seen) - 1

    wait_until(lambda: beats_seen() >= 4, interval=0.02, message="four more dispatcher runs")

    for process in (worker, beat):
        lines = [line for line in process.output().splitlines() if line.startswith("{")]
        assert lines and all(json.loads(line)["level"] for line in lines), process.name
        assert not re.search(r"dispatch.due", "\n".join(lines)), process.name
    assert dispatcher_age() < 2, "the dispatcher kept ticking, silently"
