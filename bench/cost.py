"""The `cost` part of `python -m bench`: what one delivered event costs, end to end, for fan-out 1 and 20.

A stack of its own (`gunicorn config.wsgi`, one `celery -A config worker`, `celery -A config beat`, as the README
starts them) on a Redis server of its own (so that its INFO commandstats count this stack's broker commands
alone), the bench's database and fast receiver. Events are posted through the API by 8 client threads to a
tenant of 1 or 20 endpoints (cap 1,000, so no cap bounds it), and the part waits until every delivery has
succeeded. Between a snapshot before the first post and one after the last record, per delivered event:
- CPU ms by process (user + system from /proc, for the process groups this part started, and for the
  PostgreSQL backends serving the bench's database, by pid from pg_stat_activity; a backend that exited in
  between is not counted);
- rows written per table (pg_stat_user_tables: inserted, updated, of which HOT, deleted), and index entries
  written, estimated as (inserted + non-HOT updated) x the table's indexes (an upper bound: a partial index
  takes only some rows);
- WAL bytes (pg_current_wal_lsn before and after: the whole cluster, so another database's writes in the same
  seconds count too; the commits other databases made in the window are reported beside it), and, where the
  server has pg_walinspect (PostgreSQL 15+, a contrib extension), the same WAL by resource manager (Heap,
  Btree, Transaction, ...), records and full-page images apart: a full-page image is the first change to a
  page after a checkpoint, so a short run pays for every page it touches once, whatever the rows; and by the
  relation each record changes (its first block's table or index; a commit record has none);
- statements, from pg_stat_statements when the server loads it (shared_preload_libraries), else said so; the
  bench database's transactions (pg_stat_database) in any case;
- broker commands (the private Redis's INFO commandstats delta, by command).
"""
import threading
import time
import uuid
from pathlib import Path

from bench import stack

TABLES_SQL = """
SELECT t.relname, t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_tup_del,
       (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid)
  FROM pg_stat_user_tables t"""


def _proc_cpu(pid: int) -> float | None:
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _snapshot(cursor, procs: dict, redis_client) -> dict:
    cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
    backends = {pid: _proc_cpu(pid) for (pid,) in cursor.fetchall()}
    cursor.execute(TABLES_SQL)
    tables = {name: {"inserted": ins, "updated": upd, "hot_updated": hot, "deleted": dele, "indexes": indexes}
              for name, ins, upd, hot, dele, indexes in cursor.fetchall()}
    cursor.execute("SELECT pg_current_wal_lsn()")
    (lsn,) = cursor.fetchone()
    cursor.execute("SELECT datname = current_database(), sum(xact_commit + xact_rollback) FROM pg_stat_database "
                   "WHERE datname IS NOT NULL GROUP BY 1")
    transactions = {("own" if own else "others"): int(n) for own, n in cursor.fetchall()}
    cursor.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'")
    statements = None
    if cursor.fetchone()[0]:
        cursor.execute("SELECT sum(calls) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                       "WHERE d.datname = current_database()")
        statements = int(cursor.fetchone()[0] or 0)
    return {"cpu": {name: proc.cpu_seconds() for name, proc in procs.items()}, "backends": backends,
            "tables": tables, "lsn": lsn, "transactions": transactions, "statements": statements,
            "commands": {name.removeprefix("cmdstat_"): stats["calls"]
                         for name, stats in redis_client.info("commandstats").items()}}


def _settled_snapshot(cursor, procs, redis_client, settle: float) -> dict:
    """A snapshot once every backend has reported its counters: a busy one does within a second of a
    transaction, an idle one only after PostgreSQL's idle interval (10 s), so `settle` seconds after the last
    work (11 s; 2 with --smoke, whose figures are not read)."""
    time.sleep(settle)
    return _snapshot(cursor, procs, redis_client)


def _pg_stat_statements_loaded(cursor) -> bool:
    cursor.execute("SELECT 'pg_stat_statements' = ANY(string_to_array(current_setting('shared_preload_libraries'), ','))")
    return bool(cursor.fetchone()[0])


def _walinspect(cursor) -> str | None:
    """None when pg_walinspect can read the WAL here (created in the bench database if need be), else why not."""
    cursor.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_walinspect'")
    if not cursor.fetchone()[0]:
        return "not broken down: the server has no pg_walinspect (PostgreSQL 15+ contrib)"
    try:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except Exception as exc:  # noqa: BLE001 - not a superuser: said so in the results
        return f"not broken down: CREATE EXTENSION pg_walinspect failed ({type(exc).__name__})"
    return None


def _wal_by_kind(cursor, start: str, end: str) -> tuple[dict | None, str | None]:
    """The WAL between two LSNs by resource manager: ({name: (records' bytes, full-page images' bytes)}, None), or
    (None, why not) when the server has recycled some of it already (a checkpoint meanwhile: `--smoke` runs other
    parts at once, whose VACUUM and CHECKPOINT between measurements may come while this one runs; the WAL's
    total, from the LSNs, is still counted)."""
    from django.db import OperationalError

    try:
        cursor.execute("SELECT \"resource_manager/record_type\", record_size, fpi_size "
                       "FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn) WHERE count > 0", [start, end])
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "58P01":  # undefined_file: "requested WAL segment ... removed"
            raise
        return None, "not broken down: the server recycled part of that WAL before it was read (a checkpoint)"
    return {name: (int(records), int(fpi)) for name, records, fpi in cursor.fetchall()}, None


# Each WAL record counted once, against the relation of its first block reference (a B-tree insert's index, a heap
# insert's table; a commit has none); partitions by their parent's name plus the partition's suffix folded, so that
# a day's partition and the next day's read as one.
WAL_BY_RELATION_SQL = r"""
SELECT coalesce(regexp_replace(c.relname, '_p\d{8}', '_p*'), CASE WHEN r.node IS NULL THEN '(no relation)'
                ELSE '(another database or a dropped relation)' END) AS name,
       sum(r.record_length), sum(r.fpi_length)
  FROM (SELECT substring(block_ref FROM 'blkref #0: rel \d+/\d+/(\d+)')::oid AS node, record_length, fpi_length
          FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)) r
  LEFT JOIN pg_class c ON c.relfilenode = r.node AND c.relfilenode <> 0
 GROUP BY 1"""


def _wal_by_relation(cursor, start: str, end: str) -> dict | None:
    """The WAL between two LSNs by the relation its records change ({name: (records' bytes, full-page images'
    bytes)}), or None when the server has recycled some of it already (as _wal_by_kind)."""
    from django.db import OperationalError

    try:
        cursor.execute(WAL_BY_RELATION_SQL, [start, end])
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "58P01":
            raise
        return None
    return {name: (int(records), int(fpi)) for name, records, fpi in cursor.fetchall()}


def measure(bench) -> dict:
    import redis
    import requests
    from django.db import connection

    from webhooks.models import Delivery

    port = stack.free_port()
    broker = bench.start(stack.Proc("redis-cost", ["redis-server", "--port", str(port), "--save", "",
                                                   "--appendonly", "no"], stack.base_env(),
                                    ready="Ready to accept connections"))
    url = f"redis://127.0.0.1:{port}/0"
    env = {"REDIS_URL": url, "CELERY_BROKER_URL": url}
    redis_client = redis.Redis.from_url(url)
    web = stack.gunicorn(stack.free_port(), name="gunicorn-cost", **env)
    procs = {"gunicorn": web, "worker": stack.worker("cost", **env), "beat": stack.beat(**env)}
    rows = []
    settle = bench.size(11, 11, 2)
    try:
        with connection.cursor() as cursor:
            if not _pg_stat_statements_loaded(cursor):
                statements_note = ("not counted: pg_stat_statements is not in the server's shared_preload_libraries "
                                   "(transactions of the bench database are counted instead)")
            else:
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                statements_note = "pg_stat_statements, calls in the bench database"
            wal_note = _walinspect(cursor)
        for fan, events in ((1, bench.size(1000, 400, 20)), (20, bench.size(100, 40, 2))):
            tenant, token = bench.tenant_with_endpoints(f"cost{fan}", [f"/cost{fan}/{n}" for n in range(fan)],
                                                        max_in_flight=1000)
            post_events(web.url, token, 5, threads=1)  # warm: every process has done one of each
            wait_delivered(Delivery, tenant, 5 * fan)
            bench.cancel_backlog()
            with connection.cursor() as cursor:
                before = _settled_snapshot(cursor, procs, redis_client, settle)
                started = time.monotonic()
                post_events(web.url, token, events, threads=8)
                wait_delivered(Delivery, tenant, (events + 5) * fan)
                seconds = time.monotonic() - started
                after = _settled_snapshot(cursor, procs, redis_client, settle)
                wal, note = (None, wal_note) if wal_note else _wal_by_kind(cursor, before["lsn"], after["lsn"])
                relations = None if wal is None else _wal_by_relation(cursor, before["lsn"], after["lsn"])
            rows.append(per_event(before, after, fan=fan, events=events, seconds=seconds,
                                  statements_note=statements_note, wal_by_kind=wal, wal_note=note,
                                  wal_by_relation=relations))
            print(f"cost fan-out {fan}: {format_row(rows[-1])}", flush=True)
            bench.cancel_backlog()
    finally:
        for proc in reversed(list(procs.values())):
            proc.stop()
        broker.stop()
        requests.Session().close()
    return {"rows": rows, "note": __doc__.split("\n\n", 1)[1].strip()}


def post_events(base: str, token: str, count: int, threads: int) -> None:
    import requests

    todo = list(range(count))
    lock = threading.Lock()
    failed = []

    def client():
        session = requests.Session()
        while True:
            with lock:
                if not todo:
                    return
                n = todo.pop()
            answer = session.post(f"{base}/api/v1/events", timeout=30, json={"type": "invoice.paid", "data": {
                "invoice": f"in_{n}", "amount": 1200}}, headers={"Authorization": f"Bearer {token}",
                                                                "Idempotency-Key": f"cost-{uuid.uuid4()}"})
            if answer.status_code != 202:
                failed.append(answer.status_code)

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failed:
        raise RuntimeError(f"cost: {len(failed)} posts refused ({failed[:5]})")


def wait_delivered(Delivery, tenant, count: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while Delivery.objects.filter(tenant=tenant, status=Delivery.SUCCEEDED).count() < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"cost: fewer than {count} deliveries succeeded in {timeout:g} s")
        time.sleep(0.2)


def per_event(before: dict, after: dict, *, fan: int, events: int, seconds: float, statements_note: str,
              wal_by_kind: dict | None = None, wal_note: str | None = None,
              wal_by_relation: dict | None = None) -> dict:
    def each(value: float, digits: int = 3) -> float:
        return round(value / events, digits)

    cpu = {name: each((after["cpu"][name] - before["cpu"][name]) * 1000) for name in after["cpu"]}
    backends = sum(cpu_after - (before["backends"].get(pid) or 0.0)
                   for pid, cpu_after in after["backends"].items() if cpu_after is not None)
    cpu["postgres backends"] = each(backends * 1000)
    cpu["total"] = round(sum(cpu.values()), 3)
    tables, index_entries = {}, {}
    for name, now in after["tables"].items():
        then = before["tables"].get(name, {k: 0 for k in now})
        delta = {k: now[k] - then[k] for k in ("inserted", "updated", "hot_updated", "deleted")}
        if any(delta.values()):
            tables[name] = {k: each(v, 2) for k, v in delta.items()}
            index_entries[name] = each((delta["inserted"] + delta["updated"] - delta["hot_updated"]) * now["indexes"], 2)
    commands = {name: after["commands"][name] - before["commands"].get(name, 0) for name in after["commands"]}
    commands = {name: each(n, 2) for name, n in sorted(commands.items(), key=lambda kv: -kv[1]) if n}
    statements = (each(after["statements"] - before["statements"], 1)
                  if after["statements"] is not None and before["statements"] is not None else None)
    return {
        "fan_out": fan, "events": events, "deliveries": events * fan, "seconds": round(seconds, 2),
        "cpu_ms": cpu, "rows_written": tables, "index_entries_written": index_entries,
        "index_entries_total": round(sum(index_entries.values()), 2),
        "rows_written_total": round(sum(t["inserted"] + t["updated"] + t["deleted"] for t in tables.values()), 2),
        "wal_bytes": each(_lsn(after["lsn"]) - _lsn(before["lsn"]), 0),
        "wal_records_bytes": each(sum(r for r, _ in wal_by_kind.values()), 0) if wal_by_kind is not None else None,
        "wal_fpi_bytes": each(sum(f for _, f in wal_by_kind.values()), 0) if wal_by_kind is not None else None,
        "wal_by_kind": ({name: {"records": each(r, 0), "fpi": each(f, 0)} for name, (r, f) in sorted(
            wal_by_kind.items(), key=lambda kv: -sum(kv[1]))} if wal_by_kind is not None else None),
        "wal_by_relation": ({name: {"records": each(r, 0), "fpi": each(f, 0)} for name, (r, f) in sorted(
            wal_by_relation.items(), key=lambda kv: -sum(kv[1]))} if wal_by_relation is not None else None),
        "wal_note": wal_note or "pg_walinspect's pg_get_wal_stats over the same LSNs (the whole cluster)",
        "other_databases_transactions": after["transactions"].get("others", 0) - before["transactions"].get("others", 0),
        "transactions": each(after["transactions"].get("own", 0) - before["transactions"].get("own", 0), 2),
        "statements": statements, "statements_note": statements_note,
        "broker_commands": commands, "broker_commands_total": round(sum(commands.values()), 2),
    }


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def format_row(row: dict) -> str:
    cpu = ", ".join(f"{name} {ms:.2f}" for name, ms in row["cpu_ms"].items())
    return (f"{row['events']} events, {row['deliveries']} deliveries in {row['seconds']} s; per event: CPU ms {cpu}; "
            f"rows written {row['rows_written_total']}, index entries {row['index_entries_total']}; WAL "
            f"{row['wal_bytes']:,.0f} bytes{_wal_parts(row)} (other databases' transactions meanwhile: "
            f"{row['other_databases_transactions']:,}); transactions {row['transactions']}; statements "
            f"{row['statements'] if row['statements'] is not None else 'n/a'}; broker commands "
            f"{row['broker_commands_total']} ({', '.join(f'{k} {v}' for k, v in list(row['broker_commands'].items())[:6])})"
            f"{_wal_relations(row)}")


def _wal_relations(row: dict) -> str:
    """'; WAL by relation: a N, b M, ...' (records and full-page images together), or '' without the breakdown."""
    if not row.get("wal_by_relation"):
        return ""
    return "; WAL by relation: " + ", ".join(f"{name} {v['records'] + v['fpi']:,.0f}"
                                            for name, v in row["wal_by_relation"].items())


def _wal_parts(row: dict) -> str:
    """', of which records N and full-page images M (Heap a, Btree b, ...)', or '' without pg_walinspect."""
    if row.get("wal_records_bytes") is None:
        return ""
    kinds = ", ".join(f"{name} {v['records'] + v['fpi']:,.0f}" for name, v in list(row["wal_by_kind"].items())[:4])
    return (f", of which records {row['wal_records_bytes']:,.0f} and full-page images {row['wal_fpi_bytes']:,.0f}"
            f" ({kinds})")
