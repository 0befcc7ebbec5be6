"""Log formatting and filtering for Herald's processes (wired in `config/settings.py`'s LOGGING).

- `ConsoleFormatter`: a short line per record for a person at a terminal
  (`HERALD_LOG_FORMAT=console`, which `scripts/up` sets when its output is a terminal); JSON stays
  the default everywhere else (compose, CI, a log collector).
- `QuietTicks`: Celery's lines about the frequent housekeeping task (beat's dispatcher, every
  `WEBHOOK_DISPATCH_INTERVAL_SECONDS`) go down to DEBUG when the run did nothing, so an idle system
  is quiet; a run that published deliveries still logs its line at INFO.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable

# Attributes every LogRecord has; anything else on a record came from `extra=` (or a filter).
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "request_id", "taskName"}
# Celery's per-task lines carry the task's name (and result) in `record.data`.
_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")
_IDLE_RESULTS = frozenset({"0", "None", "[]", "()"})


class ConsoleFormatter(logging.Formatter):
    """`LEVEL logger: message key=value …`: no timestamp (the launcher, honcho, prefixes each line with
    the time and the process), and only the fields that say something (Herald's own `extra=` fields,
    the request id; empty ones are left out)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {}
        if record.name.startswith("herald"):
            fields = {name: value for name, value in vars(record).items()
                      if name not in _RECORD_ATTRIBUTES and not name.startswith("_")}
        request_id = getattr(record, "request_id", "")
        if request_id:
            fields["request_id"] = request_id
        line = f"{record.levelname} {record.name}: {record.getMessage()}" + "".join(
            f" {name}={_show(value)}" for name, value in fields.items() if value not in (None, "", False, [], {}))
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def _show(value: object) -> str:
    if isinstance(value, str):
        return value if value and not any(c.isspace() or c in "\"=" for c in value) else json.dumps(value)
    return json.dumps(value, default=str, separators=(",", ":"))


class QuietTicks(logging.Filter):
    """Celery's INFO lines about `tasks` (beat sending one, a worker receiving one, a run that returned
    nothing) become DEBUG lines: dropped unless their logger is enabled for DEBUG (`--loglevel DEBUG`).

    A handler's filter, so it sees the records of every logger as they reach the handler."""

    def __init__(self, tasks: Iterable[str] = ()) -> None:
        super().__init__()
        self.tasks = frozenset(tasks)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not self._idle_tick(record):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

    def _idle_tick(self, record: logging.LogRecord) -> bool:
        if record.name == "celery.beat":  # 'Scheduler: Sending due task %s (%s)', entry name, task name
            args = record.args if isinstance(record.args, tuple) else ()
            return record.msg.startswith("Scheduler: Sending due task") and len(args) == 2 and args[1] in self.tasks
        data = getattr(record, "data", None)
        if record.name not in _TASK_LOGGERS or not isinstance(data, dict) or data.get("name") not in self.tasks:
            return False
        # "received" always; "succeeded" when it returned nothing done (dispatch_due: how many it published)
        return "return_value" not in data or str(data["return_value"]) in _IDLE_RESULTS
