"""How far the workers have got through each queue: the mark of the newest message they consumed.

Every delivery message carries a mark (when its ids were handed to the publisher). A worker keeps
the latest mark it has consumed per queue and writes it to PostgreSQL within a second (one write per
second at most). Queues are first in, first out, so a delivery published well before that mark
(WEBHOOK_REDISPATCH_AFTER_SECONDS) and still not claimed is not waiting in the queue any more: its
message was lost, and beat's dispatcher publishes it again. A delivery published after it is still
waiting its turn and is left alone, however long the backlog.
"""
import logging
import threading
from datetime import datetime

from django.db import connection

from webhooks.models import QueueProgress

_UPSERT_SQL = f"""
INSERT INTO {QueueProgress._meta.db_table} AS p (queue, consumed_mark, updated_at)
SELECT q, m, now() FROM unnest(%(queues)s::varchar[], %(marks)s::timestamptz[]) AS x(q, m)
ON CONFLICT (queue) DO UPDATE SET consumed_mark = greatest(p.consumed_mark, EXCLUDED.consumed_mark),
                                  updated_at = now()
"""
FLUSH_EVERY_SECONDS = 1.0
logger = logging.getLogger("herald.progress")

_lock = threading.Lock()
_marks: dict[str, datetime] = {}
_timer: threading.Timer | None = None


def consumed(*, queue: str, mark: datetime) -> None:
    """Note that this process consumed a message of `queue` marked `mark`; written out within a second."""
    global _timer
    with _lock:
        if queue not in _marks or mark > _marks[queue]:
            _marks[queue] = mark
        if _timer is None:
            _timer = threading.Timer(FLUSH_EVERY_SECONDS, _flush_noted)
            _timer.daemon = True
            _timer.start()


def _flush_noted() -> None:
    global _timer
    with _lock:
        _timer = None
        marks = dict(_marks)
    try:
        flush(marks)
    except Exception:  # noqa: BLE001 - the next message's mark is written a second later
        logger.exception("progress.flush_failed")
    finally:
        connection.close()  # this thread's connection (back to the worker's pool, if it has one)


def flush(marks: dict[str, datetime]) -> None:
    """Write these marks, each only if it is later than the one stored."""
    if marks:
        with connection.cursor() as cursor:
            cursor.execute(_UPSERT_SQL, {"queues": list(marks), "marks": list(marks.values())})


def consumed_marks() -> dict[str, datetime]:
    """The latest mark consumed from each queue, by any worker."""
    return dict(QueueProgress.objects.values_list("queue", "consumed_mark"))
