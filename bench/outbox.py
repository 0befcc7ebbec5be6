"""The Django outbox's costs (issue 36), in a platform project of its own (bench/outbox_settings.py):

- `publish`: what `publish()` adds to a platform's transaction (its own insert, then the outbox row),
  against a bare INSERT of the same row with a cursor, in alternating ABBA rounds of `--count`
  transactions each: the mean time of the outbox write, and of the whole transaction. The target is
  publish - bare <= 0.3 ms.
- `relay`: one relay (`Relay.drain`) moving `--rows` committed rows into the Herald at `--api`, in
  batches of 100 and then of 500 (`--batch-sizes`); events/s from its first claim to its last row marked
  sent. Target >= 1,000 events/s.

Run by `python -m bench --only outbox`, or alone against a running Herald:
`DJANGO_SETTINGS_MODULE=bench.outbox_settings python -m bench.outbox --api URL --token TOKEN`. Prints one
JSON line.
"""
import argparse
import json
import os
import statistics
import time
import uuid

import django


def _create_database(name: str) -> None:
    import psycopg

    with psycopg.connect("host=127.0.0.1 dbname=postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def publish_costs(count: int, rounds: int) -> dict:
    """Transactions of the platform's own insert plus a bare INSERT of the outbox row (`bare`) or plus
    `publish()` (`publish`), `count` of each kind per round, ABBA rounds after one warm-up round. Timed: the
    outbox write itself inside the transaction (the commit's fsync, the same for both and the noisiest
    part on a shared machine, is left out), and the whole transaction for context."""
    from django.db import connection, transaction

    from herald_client.django import publish

    data = {"invoice": "in_1", "amount": 1200}
    encoded = json.dumps(data)

    def bare(cursor):
        cursor.execute("INSERT INTO herald_outbox_message (key, tenant, type, data, channels, created_at, status, "
                       "single, event_id) VALUES (%s, '', %s, %s, '[]', now(), 'pending', false, '') RETURNING id",
                       [uuid.uuid4(), "invoice.paid", encoded])
        cursor.fetchone()

    def with_publish(cursor):
        publish("invoice.paid", data)

    kinds = (("bare", bare), ("publish", with_publish))
    write: dict[str, list[float]] = {name: [] for name, _ in kinds}
    whole: dict[str, list[float]] = {name: [] for name, _ in kinds}
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_invoice (id bigserial PRIMARY KEY, number text, paid bool)")
        for round_ in range(rounds + 1):  # round 0 warms up
            for name, action in kinds if round_ % 2 == 0 else kinds[::-1]:
                spent, started = 0.0, time.perf_counter()
                for _ in range(count):
                    with transaction.atomic():
                        cursor.execute("INSERT INTO bench_invoice (number, paid) VALUES (%s, true)",
                                       [uuid.uuid4().hex])
                        before = time.perf_counter()
                        action(cursor)
                        spent += time.perf_counter() - before
                if round_:
                    write[name].append(spent / count * 1000)
                    whole[name].append((time.perf_counter() - started) / count * 1000)
        cursor.execute("TRUNCATE herald_outbox_message, bench_invoice")
    ms = {name: statistics.median(values) for name, values in write.items()}
    return {"write_ms": {name: round(value, 4) for name, value in ms.items()},
            "rounds_write_ms": {name: [round(v, 4) for v in values] for name, values in write.items()},
            "transaction_ms": {name: round(statistics.median(values), 4) for name, values in whole.items()},
            "publish_minus_bare_ms": round(ms["publish"] - ms["bare"], 4), "count": count, "rounds": rounds}


def relay_throughput(api: str, token: str, rows: int, batch_size: int) -> dict:
    from django.db import transaction

    from herald_client import NO_RETRIES, Herald
    from herald_client.django import publish
    from herald_client.django.models import OutboxMessage
    from herald_client.django.relay import Relay

    with transaction.atomic():
        for n in range(rows):
            publish("invoice.paid", {"invoice": f"in_{n}", "amount": 1200})
    relay = Relay(client=Herald(api, token, retry=NO_RETRIES, timeout=(5.0, 60.0)), batch_size=batch_size)
    started = time.perf_counter()
    total = relay.drain(max_seconds=600)
    elapsed = time.perf_counter() - started
    left = OutboxMessage.objects.filter(status=OutboxMessage.PENDING).count()
    return {"rows": rows, "sent": total.sent, "failed": total.failed, "left": left, "seconds": round(elapsed, 2),
            "events_per_second": round(total.sent / elapsed, 1), "batch_size": batch_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--api", help="Herald's URL (the relay part; none: only publish's cost)")
    parser.add_argument("--token", help="a tenant token of that Herald")
    parser.add_argument("--count", type=int, default=2000, help="transactions per kind and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rows", type=int, default=10000, help="rows the relay moves")
    parser.add_argument("--batch-sizes", default="100,500", help="the relay's events per request, a run each")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.outbox_settings")
    _create_database(os.environ.get("BENCH_PLATFORM_DB", "herald_bench_platform"))
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    result = {"publish": publish_costs(args.count, args.rounds)}
    if args.api:
        result["relay"] = [relay_throughput(args.api, args.token, args.rows, int(size))
                           for size in args.batch_sizes.split(",")]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
