"""`python -m bench [--quick]`: run every benchmark against its floor and write bench/results/."""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import stack

RESULTS = Path(__file__).resolve().parent / "results"
LUA = Path(__file__).resolve().parent / "post.lua"


def wrk(url: str, *, mode: str, token: str, path: str, connections: int, seconds: float,
        run: str | None = None, event_type: str = "invoice.paid") -> dict:
    run = run or uuid.uuid4().hex[:10]
    threads = 1 if connections == 1 else 2
    argv = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(seconds))}s", "--timeout", "10s",
            "-s", str(LUA), url, "--", mode, token, run, path, event_type]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("WRKJSON "))
    result = json.loads(line.removeprefix("WRKJSON "))
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    result.update({f"{k[:-3]}_ms": result[k] / 1000 for k in list(result) if k.endswith("_us") and k != "duration_us"})
    return result


def _median_of(runs: list[dict]) -> dict:
    """Per key, the median of the rounds' values."""
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def abba(round_: int, items):
    """The sides of a comparison in ABBA order: as given in even rounds, reversed in odd ones, so that what drifts
    through a run (the tables growing, autovacuum, the machine's other load) falls on every side alike."""
    items = list(items)
    return items if round_ % 2 == 0 else items[::-1]


def percentile(values: list[float], pct: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    index = min(len(values) - 1, max(0, round(pct / 100 * (len(values) - 1))))
    return values[index]


# What the engine thread of a worker does (webhooks/delivery/engine.py), by the functions a py-spy stack runs
# through (bench/threads.py: the innermost named one decides): the phases of `slow_receivers`' profile.
ENGINE_PHASES = {
    "waiting for sockets or work": ("Engine._wait",),
    "claiming": ("deliveries_claim",),
    "preparing and starting attempts": ("Engine._launch", "attempt_prepare"),
    "recording": ("Engine._record",),
    "libcurl": ("Engine._drive", "Engine._finish"),
    "waking parked endpoints": ("Engine._wake_due_endpoints",),
    "closing connections": ("BaseConnectionHandler.close_all", "close_old_connections"),
}
# ... and its recorder thread (records the finished attempts the engine hands it, and claims the parked
# deliveries its freed slots go to in the same transaction).
RECORDER_PHASES = {
    "waiting for finished attempts": ("Engine._record_loop",),
    "recording": ("Engine._record_now",),
    "claiming the handed-on ones": ("claim_handed", "deliveries_record.<locals>.claim_handed"),
    "closing connections": ("BaseConnectionHandler.close_all", "close_old_connections"),
}
# ... and its claimer thread (claims what Celery's threads hand the engine, and passes the claims on).
CLAIMER_PHASES = {
    "waiting for deliveries": ("Engine._claim_loop",),
    "claiming": ("Engine._claim_now", "deliveries_claim"),
    "closing connections": ("BaseConnectionHandler.close_all", "close_old_connections"),
}


# The parts of a full run, in order: each is a method of Bench (`--only` picks some).
PARTS = ("intake", "batch", "outbox", "catalog", "filters", "delivery", "destinations", "access", "slow_receivers", "scaling", "brokers", "noisy_neighbour", "fairness", "ordering", "throttle", "pools",
         "end_to_end", "fan_out", "cost", "prune", "dispatch", "year", "erasure", "scrape", "longpoll", "memory", "tracing",
         "sustained")

class Bench:
    def __init__(self, quick: bool, rounds: int = 5, sustained_seconds: float | None = None,
                 sustained_rates: tuple[int, ...] = (100, 200, 400, 800), sustained_profile: str | None = None,
                 smoke: bool = False, out: Path = RESULTS):
        # --smoke: every part, tiny (sizes from `size`), to see that the bench still runs; never its figures
        self.smoke = smoke
        self.out = Path(out)
        self.quick = quick or smoke
        self.rounds = 1 if smoke else rounds
        self.sustained_seconds = sustained_seconds or (2 if smoke else 10 if quick else 30)
        self.sustained_rates = (20,) if smoke else sustained_rates
        self.sustained_profile = sustained_profile
        self.sustained_cap = 10  # --sustained-cap: the endpoint's cap in `sustained` (10, the default, as users get it)
        self.fairness_parts: set[str] = set()  # --fairness-parts: only these figures of `fairness` (never into results/)
        self.profile_dir: str | None = None  # --profile: py-spy during an extra, unmeasured round of intake and batch
        self.seconds = 1 if smoke else 4 if quick else 8
        self.results: dict = {"machine": machine(), "quick": self.quick, "smoke": smoke,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.procs: list[stack.Proc] = []

    def size(self, full, quick, smoke):
        """A part's size in a full run, with --quick, with --smoke."""
        return smoke if self.smoke else quick if self.quick else full

    # --- setup -------------------------------------------------------------------------------
    def setup(self):
        stack.recreate_database()
        os.environ.update(stack.base_env())
        import django

        django.setup()
        from datetime import timedelta

        from intake.credentials import credential_create
        from webhooks.conf import herald_settings
        from webhooks.services import partitions

        # the day partitions a live system has (retention's days and the coming ones), not a new database's few:
        # what a statement on the partitioned tables costs grows with them
        partitions.ensure(first=partitions.today() - timedelta(days=herald_settings.retention.EVENT_RETENTION_DAYS))
        self.receiver = self.start(stack.receiver(stack.free_port()))
        self.credential, self.token = credential_create(tenant_name="bench")
        self.floor_credential, _ = credential_create(tenant_name="bench-floor")
        self.endpoints(self.credential.tenant, 1)
        # bench.wsgi: Herald's application, the key floor served by its /api/v1/ handler (the same middleware)
        self.web = self.start(stack.gunicorn(stack.free_port(), app="bench.wsgi",
                                             BENCH_FLOOR_CREDENTIAL_ID=self.floor_credential.id))
        self.bare = self.start(stack.bare_floor(stack.free_port()))
        self.purge_queue()

    def start(self, proc):
        self.procs.append(proc)
        return proc

    def endpoints(self, tenant, count):
        from webhooks.services.endpoints import endpoint_create

        for n in range(count):
            endpoint_create(tenant=tenant, url=f"{self.receiver.url}/hook/{n}", event_types=[], channels=[])

    def purge_queue(self):
        import redis
        from django.conf import settings

        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)

    def receiver_stats(self) -> dict:
        import requests

        return requests.get(f"{self.receiver.url}/stats", timeout=10).json()

    def reset_receiver(self):
        import requests

        requests.delete(f"{self.receiver.url}/stats", timeout=5)

    # --- intake ------------------------------------------------------------------------------
    def intake(self):
        """Herald against two floors in the same run: `bare` (a DRF view with nothing of Herald's, no
        middleware, one INSERT … ON CONFLICT DO NOTHING and one UPDATE on a table of its own) and `floor`
        (Herald's key statements in Herald's own server, on the middleware chain of Herald's /api/v1/:
        bench/wsgi.py). At c=16, `--rounds` rounds in ABBA order (default 5: this machine's speed drifts
        through the day), medians; the other rows one round each."""
        import requests

        rows = []
        replay_run = uuid.uuid4().hex[:10]
        targets = (("bare", self.bare.url, "/floor/events"), ("floor", self.web.url, "/floor/events"),
                   ("herald", self.web.url, "/api/v1/events"))
        for _, base, path in targets:  # replay mode cycles through 50 keys: run each once
            for n in range(50):
                requests.post(base + path, data='{"type":"invoice.paid","data":{"invoice":"in_1","amount":1200}}',
                              headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                                       "Idempotency-Key": f"replay-{replay_run}-{n}"}, timeout=10).raise_for_status()
        plan = [("first", 16, self.rounds), ("replay", 16, self.rounds), ("mix", 16, 1), ("first", 1, 1), ("first", 64, 1),
                ("replay", 1, 1), ("replay", 64, 1)]
        if self.smoke:
            plan = plan[:2]
        for mode, connections, rounds in plan:
            runs: dict[str, list[dict]] = {name: [] for name, _, _ in targets}
            for round_ in range(rounds):
                for name, base, path in abba(round_, targets):
                    server = self.bare if name == "bare" else self.web
                    web_before, by_command_before = server.cpu_seconds(), cpu_by_command()
                    result = wrk(base + path, mode=mode, token=self.token, path=path, connections=connections,
                                 seconds=self.seconds, run=replay_run if mode == "replay" else None)
                    # CPU per request from process accounting: the server's process group, and every PostgreSQL
                    # process of the machine (its backends serve this run; whatever else runs is in it too)
                    requests_done = max(result["requests"], 1)
                    result["cpu_ms_web"] = (server.cpu_seconds() - web_before) / requests_done * 1000
                    result["cpu_ms_postgres"] = (cpu_by_command(by_command_before).get("postgres", 0.0)
                                                 / requests_done * 1000)
                    runs[name].append(result)
                    self.purge_queue()
            for name, results in runs.items():
                result = sorted(results, key=lambda r: r["rps"])[len(results) // 2]  # the median round
                # p99 is the median of the rounds' own: one round's stall would otherwise decide a ratio
                # what each side ran on: the key floor on the API's middleware chain (bench/wsgi.py), the bare
                # floor on none; the rounds in ABBA order
                result.update(chain={"bare": "none", "floor": "api", "herald": "api"}[name], order="abba")
                result.update(target=name, mode=mode, connections=connections, p99_ms=statistics.median(
                    r["p99_ms"] for r in results), rounds_rps=[round(r["rps"]) for r in results],
                    rounds_p99_ms=[round(r["p99_ms"], 1) for r in results],
                    cpu_ms_web=statistics.median(r["cpu_ms_web"] for r in results),
                    cpu_ms_postgres=statistics.median(r["cpu_ms_postgres"] for r in results))
                rows.append(result)
                print(f"intake {mode:6} c={connections:<3} {name:6} {result['rps']:8.0f} req/s "
                      f"p50 {result['p50_ms']:6.1f} ms p99 {result['p99_ms']:6.1f} ms "
                      f"errors {result['errors']} non2xx {result['non2xx']} rounds {result['rounds_rps']} "
                      f"p99s {result['rounds_p99_ms']} CPU ms/req web {result['cpu_ms_web']:.3f} "
                      f"postgres {result['cpu_ms_postgres']:.3f}", flush=True)
        if self.profile_dir:  # an extra round, not measured: py-spy costs CPU
            profilers = self.profile_into("intake-first-c16", self.seconds, web=self.web)
            wrk(self.web.url + "/api/v1/events", mode="first", token=self.token, path="/api/v1/events", connections=16,
                seconds=self.seconds)
            for profiler in profilers:
                profiler.wait(60)
        self.results["intake"] = rows
        self.cancel_backlog()

    def batch(self):
        """Batch intake (SPEC §4 `POST /events/batch`): events accepted per second in batches of 100 against
        single `POST /events`, from the same 8 client threads, same server, same body per event; `--rounds`
        alternating ABBA rounds, medians. Target (issue 35): >= 3,000 events/s in batches of 100."""
        import requests

        body = {"type": "invoice.paid", "data": {"invoice": "in_1", "amount": 1200}}
        kinds = (("batch100", "/api/v1/events/batch", 100), ("single", "/api/v1/events", 1))

        def offer(path: str, size: int, seconds: float) -> dict:
            payload = json.dumps({"events": [body] * size} if size > 1 else body)
            accepted, failed, latencies = [0], [0], []
            deadline = time.monotonic() + seconds

            def client():
                session = requests.Session()
                while time.monotonic() < deadline:
                    started = time.perf_counter()
                    answer = session.post(self.web.url + path, data=payload, timeout=30, headers={
                        "Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                        "Idempotency-Key": f"bench-{uuid.uuid4()}"})
                    latencies.append(time.perf_counter() - started)
                    if answer.status_code == 202:
                        accepted[0] += size
                    else:
                        failed[0] += 1

            started = time.monotonic()
            threads = [threading.Thread(target=client) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - started
            return {"events_per_second": accepted[0] / elapsed, "failed_requests": failed[0],
                    "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000}

        for _, path, size in kinds:
            offer(path, size, self.size(1, 1, 0.2))  # warm every gunicorn worker
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in kinds}
        for round_ in range(self.rounds):
            for name, path, size in kinds if round_ % 2 == 0 else kinds[::-1]:
                runs[name].append(offer(path, size, self.seconds))
                self.cancel_backlog()
        row = {}
        for name, results in runs.items():
            median = sorted(results, key=lambda r: r["events_per_second"])[len(results) // 2]
            row[name] = {**median, "rounds_events_per_second": [round(r["events_per_second"]) for r in results]}
        row["ratio"] = row["batch100"]["events_per_second"] / row["single"]["events_per_second"]
        row["threads"] = 8
        row["accepted_alone"] = True  # no worker ran: the backlog was cancelled after each round
        print(f"batch: {row['batch100']['events_per_second']:.0f} events/s accepted in batches of 100 "
              f"(rounds {row['batch100']['rounds_events_per_second']}, request p99 {row['batch100']['p99_ms']:.0f} ms), "
              f"single posts {row['single']['events_per_second']:.0f} events/s (rounds "
              f"{row['single']['rounds_events_per_second']}): x{row['ratio']:.1f}", flush=True)
        row["delivered"] = self.batch_delivered()
        self.results["batch"] = row

    def batch_delivered(self) -> list[dict]:
        """The backlog delivered (issue 35 item 2): batches of 100 offered at a fixed rate of events (open loop,
        8 client threads: bench/openloop.py's `offer_batches`) for `self.seconds`, with a worker and beat running
        as SPEC §1 starts them, to one endpoint on the fast local receiver, at the default cap, at 100 and at the
        worker's WEBHOOK_WORKER_CONCURRENCY (no cap at all). Per rate and cap: accepted and
        delivered events per second, post-to-arrival latency from the instant each batch was due, how long the
        backlog took to drain after the last batch, and the CPU each process used per event."""
        import requests
        from django.conf import settings

        from bench.openloop import offer_batches

        # (rate, endpoint cap): the default cap, 100, and the worker's whole concurrency (no cap at all)
        plan = self.size([(3000, settings.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT), (3000, 100),
                          (3000, settings.WEBHOOK_WORKER_CONCURRENCY), (6000, 100)], [(3000, 100)], [(300, 100)])
        tokens = {cap: self.tenant_with_endpoints(f"batch-delivered-{cap}", ["/batch"], max_in_flight=cap)[1]
                  for cap in sorted({cap for _, cap in plan})}
        procs = {"web": self.web, "worker": self.start(stack.worker("batch")), "beat": self.start(stack.beat()),
                 "receiver": self.receiver}
        url = f"{self.web.url}/api/v1/events/batch"
        rows = []
        try:
            for token in tokens.values():  # every thread warm
                offer_batches(url, token, rate=500, seconds=1, run=f"warm-{uuid.uuid4().hex[:6]}")
            time.sleep(3)
            self.cancel_backlog()
            if self.profile_dir:  # an extra offering of the plan's first, not measured: py-spy costs CPU
                rate, cap = plan[0]
                profilers = self.profile_into(f"batch-{rate}-cap{cap}", self.seconds, web=self.web,
                                              worker=procs["worker"])
                offer_batches(url, tokens[cap], rate=rate, seconds=self.seconds, run=f"p-{uuid.uuid4().hex[:6]}")
                for profiler in profilers:
                    profiler.wait(60)
                time.sleep(5)
                self.cancel_backlog()
            for rate, cap in plan:
                token = tokens[cap]
                activity = stack.ActivitySampler().__enter__()
                self.reset_receiver()
                cpu_before = {name: proc.cpu_seconds() for name, proc in procs.items()}
                by_command_before = cpu_by_command()
                sent = offer_batches(url, token, rate=rate, seconds=self.seconds, run=f"b{rate}-{uuid.uuid4().hex[:8]}")
                accepted = [s for s in sent if s.status == 202]
                self.wait_for_arrivals(len(accepted), limit=300, poll=0.2)
                drained_at = time.time()
                activity.__exit__(None, None, None)
                stats = self.receiver_stats()
                received = stats["received"]
                first_due = sent[0].due
                span = drained_at - first_due
                cpu_ms = {name: round((proc.cpu_seconds() - cpu_before[name]) / max(len(accepted), 1) * 1000, 3)
                          for name, proc in procs.items()}
                postgres = cpu_by_command(by_command_before).get("postgres", 0.0)
                cpu_ms["postgres"] = round(postgres / max(len(accepted), 1) * 1000, 3)
                delivered = [s for s in accepted if s.event_id in received]
                latency = [(received[s.event_id] - s.due) * 1000 for s in delivered]
                arrivals = sorted(received[s.event_id] for s in delivered)
                row = {
                    "rate": rate, "seconds": self.seconds, "batch": 100, "endpoint_cap": cap, "threads": 8,
                    "offered": len(sent), "accepted": len(accepted), "delivered": len(delivered),
                    "all_delivered": len(delivered) == len(sent), "duplicates": stats["count"] - len(received),
                    "accepted_per_second": len(accepted) / (max(s.answered for s in sent) - first_due),
                    "delivered_per_second": len(delivered) / (arrivals[-1] - first_due) if arrivals else 0.0,
                    "drain_seconds": (arrivals[-1] - sent[-1].due) if arrivals else float("nan"),
                    "p50_ms": percentile(latency, 50), "p99_ms": percentile(latency, 99),
                    "max_ms": max(latency, default=float("nan")),
                    "request_p99_ms": percentile([(s.answered - s.sent) * 1000 for s in sent[::100]], 99),
                    "cpu_ms_per_event": cpu_ms, "wall_seconds": round(span, 2),
                    # PostgreSQL's side: the statements its active backends ran, backends at once on average
                    "postgres_active": activity.top(),
                }
                rows.append(row)
                print(f"batch delivered {rate}/s offered x {self.seconds:g}s, cap {cap}: accepted {row['accepted']} "
                      f"({row['accepted_per_second']:.0f}/s), delivered {row['delivered']} "
                      f"({row['delivered_per_second']:.0f}/s, dup {row['duplicates']}); post->arrival p50 "
                      f"{row['p50_ms']:.0f} p99 {row['p99_ms']:.0f} max {row['max_ms']:.0f} ms; drained "
                      f"{row['drain_seconds']:.1f} s after the last batch was due; CPU ms/event {cpu_ms}; "
                      f"PostgreSQL active {row['postgres_active']}", flush=True)
                self.cancel_backlog()
        finally:
            for name in ("beat", "worker"):
                procs[name].stop()
                self.procs.remove(procs[name])
        return rows

    def outbox(self):
        """The Django outbox (issue 36), in a platform project of its own on its own database (bench/outbox.py):
        what `publish()` adds to a platform's transaction against a bare INSERT of the same row (ABBA rounds;
        target <= 0.3 ms), and one relay moving 10,000 rows into this Herald in batches of 100, then of 500
        (target >= 1,000 events/s)."""
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.outbox_settings",
               "BENCH_PLATFORM_DB": stack.DB_NAME + "_platform", "PYTHONPATH": str(stack.ROOT)}
        done = subprocess.run([sys.executable, "-m", "bench.outbox", "--api", self.web.url, "--token", self.token,
                               "--rounds", str(self.rounds), "--rows", str(self.size(10000, 2000, 200)),
                               *(["--count", "50"] if self.smoke else [])],
                              cwd=stack.ROOT, env=env, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            raise RuntimeError(f"bench.outbox failed:\n{done.stderr[-3000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        self.results["outbox"] = row
        p = row["publish"]
        relays = ", ".join(f"{r['events_per_second']:.0f} events/s in batches of {r['batch_size']} ({r['sent']} rows in "
                           f"{r['seconds']} s, {r['left']} left)" for r in row["relay"])
        print(f"outbox: publish() {p['write_ms']['publish']:.3f} ms in the transaction against a bare insert's "
              f"{p['write_ms']['bare']:.3f} ms: {p['publish_minus_bare_ms']:+.3f} ms (rounds {p['rounds_write_ms']}; "
              f"whole transactions {p['transaction_ms']}); one relay: {relays}", flush=True)
        self.cancel_backlog()

    # A catalog entry as a platform would write one: the bench's body ({"invoice": "in_1", "amount": 1200})
    # matches it; `lines` and the formats are there to be checked when present.
    CATALOG_SCHEMA = {
        "type": "object",
        "properties": {
            "invoice": {"type": "string", "pattern": "^in_[A-Za-z0-9]+$", "maxLength": 64},
            "amount": {"type": "integer", "minimum": 0},
            "currency": {"type": "string", "enum": ["eur", "usd", "gbp"]},
            "lines": {"type": "array", "items": {"type": "object", "required": ["sku", "quantity"],
                                                 "properties": {"sku": {"type": "string"},
                                                                "quantity": {"type": "integer", "minimum": 1}}}},
            "paid_at": {"type": "string", "format": "date-time"},
        },
        "required": ["invoice", "amount"],
        "additionalProperties": False,
    }

    def catalog(self):
        """The cost of a JSON Schema at intake (SPEC §12): first executions at c=16 of a type whose catalog
        entry has a schema against a type outside the catalog, same body otherwise, same server; `--rounds`
        alternating rounds, medians. Target: the schema'd type's req/s within 10 % of the other's."""
        from webhooks.services.event_catalog import event_type_create

        event_type_create(name="bench.schemad", description="bench", schema=self.CATALOG_SCHEMA,
                          example={"invoice": "in_1", "amount": 1200})
        path = "/api/v1/events"
        kinds = (("plain", "bench.plain"), ("schemad", "bench.schemad"))
        for _, event_type in kinds:  # warm: every gunicorn thread compiles its validator before the measurement
            wrk(self.web.url + path, mode="first", token=self.token, path=path, connections=16, seconds=1,
                event_type=event_type)
        runs: dict[str, list[dict]] = {name: [] for name, _ in kinds}
        for round_ in range(self.rounds):
            # ABBA order: the second run of a round meets the tables (and autovacuum) the first one grew
            for name, event_type in kinds if round_ % 2 == 0 else kinds[::-1]:
                result = wrk(self.web.url + path, mode="first", token=self.token, path=path, connections=16,
                             seconds=self.seconds, event_type=event_type)
                assert result["non2xx"] == 0 and result["errors"] == 0, result
                runs[name].append(result)
                self.purge_queue()
        medians = {name: sorted(results, key=lambda r: r["rps"])[len(results) // 2] for name, results in runs.items()}
        # What the check itself costs, in this process, apart from the noise of a shared machine: one validation
        # of the bench's data with the held validator, against the request's whole time at c=1 (CPU and waits).
        from webhooks import event_schemas

        validator = event_schemas.schema_check(self.CATALOG_SCHEMA)
        data = {"invoice": "in_1", "amount": 1200}
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(self.size(2000, 2000, 50)):
                event_schemas.instance_errors(validator, data, pointer="/data")
            timings.append((time.perf_counter() - started) / self.size(2000, 2000, 50) * 1e6)
        single = wrk(self.web.url + path, mode="first", token=self.token, path=path, connections=1,
                     seconds=self.seconds, event_type="bench.plain")
        ingest_us = self.ingest_us([event_type for _, event_type in kinds], data)
        row = {"plain_rps": medians["plain"]["rps"], "schemad_rps": medians["schemad"]["rps"],
               "ratio": medians["schemad"]["rps"] / medians["plain"]["rps"],
               "plain_p99_ms": statistics.median(r["p99_ms"] for r in runs["plain"]),
               "schemad_p99_ms": statistics.median(r["p99_ms"] for r in runs["schemad"]),
               "rounds_rps": {name: [round(r["rps"]) for r in results] for name, results in runs.items()},
               "validation_us": round(min(timings), 1), "request_c1_mean_ms": round(single["mean_ms"], 2),
               "ingest_us": ingest_us}
        self.results["catalog"] = row
        print(f"catalog: intake of a schema'd type {row['schemad_rps']:.0f} req/s, of a type without one "
              f"{row['plain_rps']:.0f} req/s: ratio {row['ratio']:.3f} (rounds {row['rounds_rps']}); p99 "
              f"{row['schemad_p99_ms']:.1f} / {row['plain_p99_ms']:.1f} ms; one validation {row['validation_us']} us "
              f"against a request's {row['request_c1_mean_ms']} ms at c=1; event_ingest in this process "
              f"{ingest_us}", flush=True)
        self.cancel_backlog()

    def filters(self):
        """Payload filters at intake (SPEC §15): event_ingest for a tenant of 100 endpoints that each carry a
        filter (all matching: the same deliveries) against a tenant of 100 without, in this process, `--rounds`
        alternating batches of 100 events (each rolled back); the median batch's mean. Target: ratio <= 1.1.
        Also the signing cost of one attempt, v1 (HMAC-SHA256) against v1a (ed25519), in this process."""
        from django.db import transaction

        from intake.credentials import credential_create
        from webhooks.delivery import signing
        from webhooks.services.endpoints import endpoint_create
        from webhooks.services.events import event_ingest

        the_filter = {"type": {"$startsWith": "invoice."},
                      "data": {"amount": {"$gte": 0}, "currency": {"$in": ["EUR", "USD", "GBP"]},
                               "customer": {"country": {"$neq": "XX"}}}}
        tenants = {}
        fan, batch = self.size(100, 100, 5), self.size(100, 100, 5)
        for name, payload_filter in (("plain", None), ("filtered", the_filter)):
            credential, _ = credential_create(tenant_name=f"filters-{name}")
            for n in range(fan):
                endpoint_create(tenant=credential.tenant, url=f"{self.receiver.url}/hook/{n}", event_types=[],
                                channels=[], filter=payload_filter)
            tenants[name] = credential.tenant
        data = {"invoice": "in_1", "amount": 1200, "currency": "EUR", "customer": {"country": "DE", "id": "c_1"},
                "lines": [{"sku": f"sku_{n}", "qty": n} for n in range(10)]}
        batches: dict[str, list[float]] = {name: [] for name in tenants}
        rounds = self.size(max(self.rounds, 7), max(self.rounds, 7), 1)
        for round_ in range(rounds):
            for name in (list(tenants) if round_ % 2 == 0 else list(tenants)[::-1]):
                with transaction.atomic():
                    started = time.perf_counter()
                    for _ in range(batch):
                        event = event_ingest(tenant=tenants[name], event_type="invoice.paid", data=data, channels=[])
                        assert len(event.delivery_list) == fan
                    batches[name].append((time.perf_counter() - started) / batch * 1e6)
                    transaction.set_rollback(True)
        medians = {name: statistics.median(times) for name, times in batches.items()}
        # The match alone, in PostgreSQL: the filter's jsonpath against this event's document, 20,000 times
        # per statement, against the same statement with no filter; the difference per evaluation, in us.
        from django.db import connection

        from webhooks import filters as filter_module

        doc = json.dumps({"type": "invoice.paid", "data": data, "channels": []})
        path = filter_module.filter_compile(the_filter)
        match_sql = ("SELECT count(*) FROM generate_series(1, 20000) n, (SELECT %s::jsonb AS d) doc "
                     "WHERE {}")
        per_statement = {"match": [], "none": []}
        with connection.cursor() as cursor:
            for _ in range(self.size(7, 7, 1)):
                # (the document by way of the row: with two constants the planner would match once, up front)
                for name, where, params in (("match", "(CASE WHEN n > 0 THEN d END) @@ %s::jsonpath", [doc, path]),
                                            ("none", "(CASE WHEN n > 0 THEN d END) IS NOT NULL", [doc])):
                    started = time.perf_counter()
                    cursor.execute(match_sql.format(where), params)
                    assert cursor.fetchone()[0] == 20000
                    per_statement[name].append(time.perf_counter() - started)
        match_us = (min(per_statement["match"]) - min(per_statement["none"])) / 20000 * 1e6
        body = json.dumps({"type": "invoice.paid", "timestamp": "2026-01-01T00:00:00Z", "data": data}).encode()
        sign_us = {}
        for scheme in (signing.V1, signing.V1A):
            key = signing.generate_signing_key(scheme)
            timings = []
            for _ in range(self.size(5, 5, 1)):
                started = time.perf_counter()
                for _ in range(self.size(2000, 2000, 20)):
                    signing.signature_header(secrets=[key], msg_id="evt_1", timestamp=1_700_000_000, body=body)
                timings.append((time.perf_counter() - started) / self.size(2000, 2000, 20) * 1e6)
            sign_us[scheme] = round(min(timings), 1)
        row = {"plain_us": round(medians["plain"], 1), "filtered_us": round(medians["filtered"], 1),
               "ratio": round(medians["filtered"] / medians["plain"], 3),
               "rounds_us": {name: [round(t) for t in times] for name, times in batches.items()},
               "sign_us": sign_us, "match_us_per_endpoint": round(match_us, 2)}
        self.results["filters"] = row
        print(f"filters: event_ingest to 100 endpoints with filters {row['filtered_us']} us, without "
              f"{row['plain_us']} us: ratio {row['ratio']} (rounds {row['rounds_us']}); one filter's match in "
              f"PostgreSQL {row['match_us_per_endpoint']} us; signing one attempt "
              f"v1 {sign_us['v1']} us, v1a {sign_us['v1a']} us", flush=True)

    def ingest_us(self, event_types: list[str], data) -> dict[str, float]:
        """event_ingest alone (its statement and the check), per type, in this process: alternating batches of
        200, each in a transaction rolled back; the median batch's mean, in microseconds."""
        from django.db import transaction

        from webhooks.services.events import event_ingest

        tenant = self.credential.tenant
        batches: dict[str, list[float]] = {event_type: [] for event_type in event_types}
        batch = self.size(200, 200, 10)
        for round_ in range(self.size(7, 7, 1)):
            for event_type in event_types if round_ % 2 == 0 else event_types[::-1]:
                with transaction.atomic():
                    started = time.perf_counter()
                    for _ in range(batch):
                        event_ingest(tenant=tenant, event_type=event_type, data=data, channels=[])
                    batches[event_type].append((time.perf_counter() - started) / batch * 1e6)
                    transaction.set_rollback(True)
        return {event_type: round(statistics.median(times), 1) for event_type, times in batches.items()}

    def cancel_backlog(self):
        from django.db import connection

        from webhooks.models import Delivery, DeliveryOutbox

        from django.db import OperationalError

        for attempt in range(20):
            try:  # the worker may still be recording a batch of these: its locks and this UPDATE's can cross
                Delivery.objects.filter(status=Delivery.PENDING).update(status=Delivery.CANCELLED)
                break
            except OperationalError as exc:
                if "deadlock" not in str(exc) or attempt == 19:
                    raise
        DeliveryOutbox.objects.all().delete()
        self.purge_queue()
        # Leave no autovacuum of the rows just written to run during the next measurement, and no dead rows for
        # the next one to meet: the leases churn a row per delivery and the counts an update, so on a server
        # whose autovacuum is off (this machine's CI configuration, 2026-12-07) a 40-minute fairness run had
        # left 618,000 dead leases behind it, and each round met more of them than the one before.
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE webhooks_delivery, webhooks_deliveryoutbox, webhooks_event, "
                           "intake_idempotencykey, webhooks_deliverylease, webhooks_deliverycount, "
                           "webhooks_deliveryattempt")
            cursor.execute("CHECKPOINT")

    # --- delivery ----------------------------------------------------------------------------
    def make_deliveries(self, tenant, events: int, event_type: str = "invoice.paid") -> list[str]:
        from django.db import transaction

        from webhooks.services.events import event_ingest

        ids = []
        for n in range(events):
            with transaction.atomic():
                event = event_ingest(tenant=tenant, event_type=event_type, data={"invoice": f"in_{n}"},
                                     channels=[])
            ids += [d.id for d in event.delivery_list]
        from webhooks.delivery.publishing import publisher

        assert publisher.flush(30), "the publisher did not publish the deliveries"
        return ids

    @staticmethod
    def table_writes() -> dict:
        """Rows inserted, updated (and of those, HOT: no index touched) and deleted so far, per table."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables "
                           "WHERE relname IN ('webhooks_delivery', 'webhooks_deliverylease', 'webhooks_deliveryattempt', "
                           "'webhooks_deliveryoutbox')")
            return {name: {"inserted": ins, "updated": upd, "hot_updated": hot, "deleted": dele}
                    for name, ins, upd, hot, dele in cursor.fetchall()}

    def tenant_with_endpoints(self, name: str, paths: list[str], **options):
        """A tenant with one endpoint per receiver path (all subscribed to everything), and its token."""
        from intake.credentials import credential_create
        from webhooks.services.endpoints import endpoint_create

        credential, token = credential_create(tenant_name=f"{name}-{uuid.uuid4().hex[:6]}")
        for path in paths:
            endpoint_create(tenant=credential.tenant, url=f"{self.receiver.url}{path}", event_types=[],
                            channels=[], **options)
        return credential.tenant, token

    def wait_for_arrivals(self, expected: int, *, limit: float, poll: float, quiet: float = 20) -> None:
        """Until the receiver has counted `expected` requests, or none arrived for `quiet` s, or `limit` s."""
        import requests

        last_count, last_progress = -1, time.monotonic()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and time.monotonic() - last_progress < quiet:
            count = int(requests.get(f"{self.receiver.url}/count", timeout=10).text)
            if count >= expected:
                return
            if count != last_count:
                last_count, last_progress = count, time.monotonic()
            time.sleep(poll)

    @staticmethod
    def hold_outbox(workers: int):
        """Hold every unpublished delivery (due in an hour) until `workers` workers have started; returns drain's
        `fill`, called once every worker is ready, which makes them due at once and rings the relays' doorbell."""
        from django.db import connection

        from webhooks.delivery.publishing import publisher

        with connection.cursor() as cursor:
            cursor.execute("UPDATE webhooks_deliveryoutbox SET due_at = now() + interval '1 hour' "
                           "WHERE published_at IS NULL RETURNING delivery_id")
            held = [row[0] for row in cursor.fetchall()]

        def release():
            with connection.cursor() as cursor:
                cursor.execute("UPDATE webhooks_deliveryoutbox SET due_at = now() WHERE delivery_id = ANY(%s) "
                               "AND published_at IS NULL", [held])
            publisher.ring()
            publisher.flush(30)
        return release

    def drain(self, expected: int, name: str = "drain", timeout: float = 300, argv: list[str] = (),
              workers: int = 1, beat: bool = False, keep_stats: bool = False, fill=None, profile: str | None = None,
              profile_seconds: float = 10, profile_wall: bool = False, **env) -> dict:
        """Start `celery -A config worker` (as the README does; `argv` adds flags, `env` settings) on a
        pre-filled queue (`fill`, if given, is called once every worker is ready); deliveries/s from the
        receiver's first to last arrival, the most attempts in flight, the PostgreSQL connections, the
        CPU the workers used and the machine's busy fraction from the workers' start to the last arrival (and the
        receiver's `stats`). `profile`: py-spy records the first worker from its
        start for `profile_seconds`, into --profile's directory as worker-<profile>.txt (`profile_wall`: every
        thread, running or waiting: profile_into's `wall`)."""
        self.reset_receiver()
        with stack.ConnectionSampler("herald-worker") as connections:
            procs = [stack.worker(f"{name}{n}", *argv, **env) for n in range(workers)]
            if beat:
                procs.append(stack.beat(**env))
            cpu_at_start = sum(proc.cpu_seconds() for proc in procs[:workers])
            busy_at_start = machine_busy()
            profilers = (self.profile_into(profile, profile_seconds, wall=profile_wall, worker=procs[0])
                         if profile and self.profile_dir else [])
            if fill is not None:
                fill()
            try:
                deadline = time.monotonic() + timeout
                while self.receiver_stats()["count"] < expected:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"only {self.receiver_stats()['count']}/{expected} delivered")
                    time.sleep(0.1)
                stats = self.receiver_stats()
                peak = procs[0].peak_rss_mb()
                cpu = sum(proc.cpu_seconds() for proc in procs[:workers]) - cpu_at_start
                busy = machine_busy(busy_at_start)
            finally:
                for profiler in profilers:
                    profiler.wait(60)
                for proc in reversed(procs):
                    proc.stop()
        span = stats["last"] - stats["first"]
        return {"deliveries": expected, "seconds": span, "per_second": (stats["count"] - 1) / span if span else 0,
                "peak_in_flight": max(stats["peak_in_flight"].values(), default=0),
                "db_connections_peak": connections.peak, "worker_peak_rss_mb": round(max(peak.values()), 1),
                "worker_cpu_ms": cpu / expected * 1000, "machine_busy": busy,
                **({"stats": stats} if keep_stats else {})}

    def delivery(self):
        """A fast local receiver: Herald against a bare Celery task, same worker command on both sides, in two
        forms: `floor` (one Celery message per POST) and `floor_batched` (as Herald's relay publishes: one
        message per 100 POSTs, sent at once on libcurl's multi interface). Herald's endpoint cap is set to the
        worker's WEBHOOK_WORKER_CONCURRENCY (the row says which), so the cap does not bound it; a last drain at
        the default cap. Alternating ABBA rounds (three; one with --quick), medians: a single pair of runs on a
        shared 2-core machine moved the ratio by 0.1 either way.
        """
        from django.conf import settings

        from bench.floor_tasks import floor_post, floor_post_many

        count = self.size(1500, 400, 50)
        cap = settings.WEBHOOK_WORKER_CONCURRENCY
        uncapped, _ = self.tenant_with_endpoints("fast", ["/fast"], max_in_flight=cap)
        runs: dict[str, list[dict]] = {"floor": [], "floor_batched": [], "herald": []}
        writes = {}

        def floor():
            for n in range(count):
                floor_post.delay(f"floor-{n}", f"{self.receiver.url}/floor")
            runs["floor"].append(self.drain(count, "floor"))

        def floor_batched():
            for first in range(0, count, 100):
                floor_post_many.delay([f"floorb-{n}" for n in range(first, min(count, first + 100))],
                                      f"{self.receiver.url}/floor")
            runs["floor_batched"].append(self.drain(count, "floor"))

        def herald():
            nonlocal writes
            self.make_deliveries(uncapped, count)
            before = self.table_writes()
            runs["herald"].append(self.drain(count, "herald"))
            time.sleep(1.5)  # PostgreSQL publishes a backend's counters within a second
            writes = {table: {k: after[k] - before[table][k] for k in after}
                      for table, after in self.table_writes().items()}

        for round_ in range(self.size(3, 1, 1)):
            for side in abba(round_, (floor, floor_batched, herald)):
                side()
        capped, _ = self.tenant_with_endpoints("fast-default-cap", ["/fast"])
        self.make_deliveries(capped, count)
        default_cap = self.drain(count, "herald-cap")
        floor_, batched, herald_ = (sorted(r, key=lambda r: r["per_second"])[len(r) // 2] for r in runs.values())
        row = {"worker_processes": 1, "worker_threads": settings.CELERY_WORKER_CONCURRENCY, "herald_cap": cap,
               "default_cap": settings.WEBHOOK_ENDPOINT_MAX_IN_FLIGHT, "order": "abba",
               "floor": floor_, "floor_batched": batched, "herald": herald_, "herald_default_cap": default_cap,
               "ratio": herald_["per_second"] / floor_["per_second"],
               "ratio_batched": herald_["per_second"] / batched["per_second"],
               "runs": {name: [round(r["per_second"]) for r in results] for name, results in runs.items()},
               "table_writes_per_delivery": {table: {k: round(v / count, 2) for k, v in w.items()}
                                             for table, w in writes.items()}}
        print(f"delivery (fast receiver) herald (cap {cap}) {herald_['per_second']:.0f}/s, floor "
              f"{floor_['per_second']:.0f}/s (ratio {row['ratio']:.2f}), floor batched by 100 "
              f"{batched['per_second']:.0f}/s (ratio {row['ratio_batched']:.2f}) (runs {row['runs']}); at the default "
              f"cap of {row['default_cap']}: {default_cap['per_second']:.0f}/s", flush=True)
        self.results["delivery"] = [row]

    def destinations(self):
        """The broker destinations of SPEC §14 from one worker (the README's command) to the local RabbitMQ, Redis
        and NATS JetStream: deliveries/s from Herald's first to last attempt of a pre-filled backlog to one
        endpoint each (its cap the worker's WEBHOOK_WORKER_CONCURRENCY, as in `delivery`), worker CPU per
        delivery, and the broker's own count of what arrived. The kinds alternate over the rounds (three; one
        with --quick), medians. Target (issue 37): >= 2,000 messages/s for each kind."""
        import amqp
        import redis
        from django.conf import settings

        from webhooks.models import EndpointAccess

        count = self.size(3000, 1000, 50)
        cap = settings.WEBHOOK_WORKER_CONCURRENCY
        name = f"herald-bench-{uuid.uuid4().hex[:8]}"
        admin = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
        admin.connect()
        channel = admin.channel()
        channel.exchange_declare(name, "direct", durable=False, auto_delete=False)
        channel.queue_declare(name, durable=False, auto_delete=False)
        channel.queue_bind(name, name, routing_key=name)
        stream_db = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        nats_stream = name.replace("-", "_")
        self._nats_admin("add", nats_stream, name)
        kinds = {
            "amqp": ({"kind": "amqp", "url": "amqp://guest:guest@127.0.0.1:5672/", "exchange": name, "routing_key": name},
                     lambda: channel.queue_declare(name, passive=True).message_count),
            "redis_stream": ({"kind": "redis_stream", "url": settings.CELERY_BROKER_URL, "stream": name},
                             lambda: stream_db.xlen(name)),
            "nats": ({"kind": "nats", "url": "nats://127.0.0.1:4222", "subject": name},
                     lambda: self._nats_admin("count", nats_stream, name)),
        }
        runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
        try:
            for round_ in range(self.size(3, 1, 1)):
                for kind in abba(round_, list(kinds)):
                    fields, arrived = kinds[kind]
                    before = arrived()
                    tenant, _ = self.tenant_with_broker(f"dest-{kind}", max_in_flight=cap, **fields)
                    ids = self.make_deliveries(tenant, count)
                    run = self.drain_to_destination(ids, f"dest-{kind}")
                    run["arrived"] = arrived() - before
                    runs[kind].append(run)
                    assert EndpointAccess.objects.filter(endpoint__tenant=tenant).count() == 1
        finally:
            channel.queue_delete(name)
            channel.exchange_delete(name)
            admin.close()
            stream_db.delete(name)
            self._nats_admin("delete", nats_stream, name)
        rows = {}
        for kind, results in runs.items():
            median = sorted(results, key=lambda r: r["per_second"])[len(results) // 2]
            rows[kind] = {**median, "runs": [round(r["per_second"]) for r in results], "target_per_second": 2000,
                          "meets_target": median["per_second"] >= 2000}
            print(f"destinations {kind:12} {median['per_second']:6.0f} messages/s (runs {rows[kind]['runs']}), "
                  f"worker CPU {median['worker_cpu_ms']:.3f} ms each, {median['arrived']}/{count} at the broker",
                  flush=True)
        self.results["destinations"] = {"deliveries": count, "worker_processes": 1, "herald_cap": cap,
                                        "order": "abba", "kinds": rows}

    @staticmethod
    def _nats_admin(action: str, stream: str, subject: str):
        """A JetStream stream for the `destinations` part: added, its message count, or deleted."""
        import asyncio

        import nats

        async def run():
            client = await nats.connect("nats://127.0.0.1:4222")
            try:
                js = client.jetstream()
                if action == "add":
                    await js.add_stream(name=stream, subjects=[subject])
                elif action == "count":
                    return (await js.stream_info(stream)).state.messages
                else:
                    await js.delete_stream(stream)
            finally:
                await client.close()

        return asyncio.run(run())

    def tenant_with_broker(self, name: str, **fields):
        """A tenant with one broker endpoint (subscribed to everything), and its token."""
        from intake.credentials import credential_create
        from webhooks.services.endpoints import endpoint_create

        credential, token = credential_create(tenant_name=f"{name}-{uuid.uuid4().hex[:6]}")
        endpoint_create(tenant=credential.tenant, event_types=[], channels=[], **fields)
        return credential.tenant, token

    def drain_to_destination(self, ids: list[str], name: str, timeout: float = 300) -> dict:
        """Start one worker on the published backlog `ids`; deliveries/s from Herald's first to its last attempt
        (as recorded: a broker has no receiver to time arrivals), and the worker's CPU per delivery."""
        from webhooks.models import Delivery, DeliveryAttempt

        with stack.ConnectionSampler("herald-worker") as connections:
            worker = stack.worker(name)
            cpu_at_start = worker.cpu_seconds()
            try:
                deadline = time.monotonic() + timeout
                while Delivery.objects.filter(pk__in=ids, status=Delivery.SUCCEEDED).count() < len(ids):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{name}: only {Delivery.objects.filter(pk__in=ids, status='succeeded').count()}"
                                           f"/{len(ids)} delivered")
                    time.sleep(0.1)
                cpu = worker.cpu_seconds() - cpu_at_start
                peak = worker.peak_rss_mb()
            finally:
                worker.stop()
        # from the first attempt's start to the last one's end (the attempts of a batch share their start)
        attempts = list(DeliveryAttempt.objects.filter(delivery_id__in=ids).values_list("started_at", "duration_ms",
                                                                                        "error"))
        first = min(started for started, _, _ in attempts).timestamp()
        last = max(started.timestamp() + duration / 1000 for started, duration, _ in attempts)
        seconds = last - first
        failed = sum(1 for _, _, error in attempts if error)
        return {"deliveries": len(ids), "seconds": seconds,
                "per_second": len(ids) / seconds if seconds else 0, "failed_attempts": failed,
                "db_connections_peak": connections.peak, "worker_peak_rss_mb": round(max(peak.values()), 1),
                "worker_cpu_ms": cpu / len(ids) * 1000}

    def access(self):
        """Worker CPU per delivery to an endpoint with extra headers and auth (SPEC §11) against one without,
        the same fast receiver, in alternating rounds (ABBA order, medians; each round's own ratio beside them):
        the access comes with the claim (read once per endpoint and batch, decrypted once per worker process) and
        costs a few header lines and libcurl options per attempt. Basic auth and bearer alternate with the
        rounds; an OAuth2 token is fetched once per worker and then costs what a bearer token does."""
        from django.conf import settings

        count = self.size(3000, 1000, 50)  # CPU time is counted in 10 ms ticks: enough deliveries to resolve 5 %
        cap = settings.WEBHOOK_WORKER_CONCURRENCY
        plain, _ = self.tenant_with_endpoints("access-plain", ["/fast"], max_in_flight=cap)
        headers = {f"X-Header-{n}": f"value-{n}-" + "v" * 40 for n in range(5)}
        guarded = {kind: self.tenant_with_endpoints(f"access-{kind}", ["/fast"], max_in_flight=cap, headers=headers,
                                                    auth=auth)[0]
                   for kind, auth in (("basic", {"type": "basic", "username": "herald", "password": "p" * 32}),
                                      ("bearer", {"type": "bearer", "token": "t" * 64}))}
        plains, withs = [], []
        for round_ in range(self.size(max(5, self.rounds), max(5, self.rounds), 1)):
            # ABBA order: the second drain of a round meets the tables (and autovacuum) the first one grew
            pair = (("plain", plain, plains), ("with", guarded["basic" if round_ % 2 else "bearer"], withs))
            for name, tenant, runs in pair if round_ % 2 == 0 else pair[::-1]:
                self.make_deliveries(tenant, count)
                runs.append(self.drain(count, f"access-{name}"))
        median = statistics.median
        row = {"deliveries": count, "rounds": len(plains),
               "plain_worker_cpu_ms": median(r["worker_cpu_ms"] for r in plains),
               "with_access_worker_cpu_ms": median(r["worker_cpu_ms"] for r in withs),
               "plain_per_second": median(r["per_second"] for r in plains),
               "with_access_per_second": median(r["per_second"] for r in withs),
               "runs_cpu_ms": {"plain": [round(r["worker_cpu_ms"], 3) for r in plains],
                               "with_access": [round(r["worker_cpu_ms"], 3) for r in withs]},
               "runs_per_second": {"plain": [round(r["per_second"]) for r in plains],
                                   "with_access": [round(r["per_second"]) for r in withs]}}
        row["cpu_ratio"] = row["with_access_worker_cpu_ms"] / row["plain_worker_cpu_ms"]
        # each round's own ratio (its two drains ran back to back): how far one round can be trusted
        row["rounds_cpu_ratio"] = [round(w["worker_cpu_ms"] / p["worker_cpu_ms"], 3) for p, w in zip(plains, withs)]
        self.results["access"] = row
        print(f"access: {row['with_access_worker_cpu_ms']:.3f} ms worker CPU per delivery with 5 headers and auth, "
              f"{row['plain_worker_cpu_ms']:.3f} ms without (ratio {row['cpu_ratio']:.3f}; runs {row['runs_cpu_ms']}, "
              f"per round {row['rounds_cpu_ratio']}); "
              f"{row['with_access_per_second']:.0f}/s against {row['plain_per_second']:.0f}/s "
              f"(runs {row['runs_per_second']})", flush=True)

    def ordering(self):
        """fifo: the rate one endpoint keeps to a fast receiver, and event order kept by two workers while
        its head fails three times (the schedule shortened to 1 s steps so the run stays short)."""
        from webhooks.models import Delivery

        count = self.size(500, 200, 20)
        tenant, _ = self.tenant_with_endpoints("fifo-rate", ["/fifo"], ordering="fifo")
        self.make_deliveries(tenant, count)
        rate = self.drain(count, "fifo", workers=2)
        tenant, _ = self.tenant_with_endpoints("fifo-order", ["/failat/10,11,12/fifo"], ordering="fifo")
        ids = self.make_deliveries(tenant, count)
        order = self.drain(count + 3, "fifo-order", workers=2, beat=True, keep_stats=True,
                           WEBHOOK_RETRY_SCHEDULE="1,1,1,1", WEBHOOK_RETRY_JITTER="0",
                           WEBHOOK_DISPATCH_INTERVAL_SECONDS="0.5")
        events = list(Delivery.objects.filter(pk__in=ids).order_by("id").values_list("event_id", flat=True))
        arrived = order["stats"]["first_ok"]["/failat/10,11,12"]
        self.results["ordering"] = {
            "deliveries": count, "per_second": rate["per_second"], "peak_in_flight": rate["peak_in_flight"],
            "in_event_order": arrived == events, "failed_requests": [10, 11, 12],
            "seconds_with_failing_head": order["seconds"]}
        print(f"fifo: {rate['per_second']:.0f} deliveries/s to a fast receiver ({rate['peak_in_flight']} in flight); "
              f"with requests 10-12 failing, first successes in event order: {arrived == events} "
              f"({order['seconds']:.1f}s)", flush=True)
        self.cancel_backlog()

    def throttle(self):
        """throttle_rate 20 with 400 deliveries over two workers; an unthrottled endpoint beside it."""
        count = self.size(400, 200, 20)
        tenant, _ = self.tenant_with_endpoints("free-alone", ["/free"])
        self.make_deliveries(tenant, count)
        alone = self.drain(count, "free", workers=2)
        from webhooks.services.endpoints import endpoint_create

        tenant, _ = self.tenant_with_endpoints("throttle", [])
        endpoint_create(tenant=tenant, url=f"{self.receiver.url}/delay/0/paced", event_types=["paced.*"], channels=[],
                        throttle_rate=20)
        endpoint_create(tenant=tenant, url=f"{self.receiver.url}/free", event_types=["free.*"], channels=[])
        self.make_deliveries(tenant, count, event_type="paced.happened")
        self.make_deliveries(tenant, count, event_type="free.happened")
        both = self.drain(2 * count, "throttle", workers=2, keep_stats=True)
        paced = sorted(both["stats"]["arrivals"]["/delay/0"])
        free = sorted(both["stats"]["arrivals"]["/"])
        window = max(sum(1 for t in paced if start <= t < start + 1) for start in paced)
        result = {"deliveries": count, "rate": 20, "max_in_one_second": window, "seconds": paced[-1] - paced[0],
                  "free_seconds_alone": alone["seconds"], "free_seconds_beside": free[-1] - free[0]}
        self.results["throttle"] = result
        print(f"throttle 20/s: {count} deliveries in {result['seconds']:.1f}s, at most {window} in any second; "
              f"unthrottled endpoint {result['free_seconds_beside']:.2f}s beside it, "
              f"{result['free_seconds_alone']:.2f}s alone", flush=True)
        self.cancel_backlog()

    def pools(self):
        """How Celery pools overlap network waits: the bare POST task against 200 ms receivers, per pool."""
        from bench.floor_tasks import floor_post, floor_post_requests

        rows = []
        variants = [("threads x100, libcurl (the default)", floor_post, [], 1000),
                    ("threads x100, requests", floor_post_requests, [], 1000),
                    ("gevent x100, requests", floor_post_requests, ["--pool", "gevent", "--concurrency", "100"], 1000),
                    ("prefork x2, libcurl", floor_post, ["--pool", "prefork", "--concurrency", "2"], 100)]
        for label, task, argv, count in variants:
            count = min(count, 10) if self.smoke else count
            for n in range(count):
                task.delay(f"pool-{n}", f"{self.receiver.url}/delay/200/pool")
            result = self.drain(count, "pool", argv=argv)
            result["pool"] = label
            rows.append(result)
            print(f"pool {label}: {result['per_second']:.0f} POSTs/s, {result['worker_cpu_ms']:.2f} ms CPU each",
                  flush=True)
        self.results["pools"] = rows

    def slow_receivers(self):
        """Many endpoints leave no cap unused: 90 endpoints that each answer after 200 ms, at their default cap of 10
        (900 attempts at once, under the worker's 1,000, so the caps are what may bound it: 4,500 deliveries/s at
        most), a backlog of 4,050 deliveries made before the worker starts, one worker as the README starts it;
        against the same worker holding only 100 attempts in flight (WEBHOOK_WORKER_CONCURRENCY=100, the earlier
        default: 500/s at most). Alternating rounds, medians; the machine's CPU busy fraction over each drain says
        whether the CPU ran out. With --profile, an extra round, not measured, records py-spy of the worker."""
        endpoints, cap, delay_ms = 90, 10, 200
        tenant, _ = self.tenant_with_endpoints("slow", [f"/delay/{delay_ms}/ep{n}" for n in range(endpoints)],
                                               max_in_flight=cap)
        runs: dict[str, list[dict]] = {"default": [], "100 in flight": []}
        per_endpoint = self.size(45, 45, 2)
        for round_ in range(self.size(3, 1, 1)):
            for label, env in abba(round_, (("default", {}), ("100 in flight", {"WEBHOOK_WORKER_CONCURRENCY": 100}))):
                self.make_deliveries(tenant, per_endpoint)  # x endpoints
                runs[label].append(self.drain(per_endpoint * endpoints, "slow", **env))
                # each drain leaves a dead lease per delivery, which every later claim's count of its endpoint's
                # leases reads through where autovacuum is off (the rounds fell from 1,233 to 663/s): the next
                # drain starts from the state autovacuum would leave, as in `fairness`
                self.cancel_backlog()
        profiled = None
        if self.profile_dir:
            # An extra round, not measured (py-spy costs CPU): every thread of the worker sampled, running or
            # waiting, for 8 s from the worker's start, through a backlog six times as long (24,300 deliveries:
            # the profile ends before the drain does at any rate under 3,000/s, so no idle tail is counted);
            # where the engine thread's time goes names the bound.
            from bench.threads import thread_phases

            self.make_deliveries(tenant, per_endpoint * 6)
            with stack.ActivitySampler() as activity:  # and PostgreSQL's side: what its busy backends ran, and on what
                extra = self.drain(per_endpoint * 6 * endpoints, "slow", profile="slow-receivers", profile_wall=True,
                                   profile_seconds=8)
            self.cancel_backlog()
            recorded = Path(self.profile_dir) / "worker-slow-receivers.txt"
            profiled = thread_phases(recorded, "herald-engine", ENGINE_PHASES)
            profiled["per_second"] = round(extra["per_second"])
            profiled["recorder"] = thread_phases(recorded, "herald-recorder", RECORDER_PHASES)
            profiled["claimer"] = thread_phases(recorded, "herald-claimer", CLAIMER_PHASES)
            profiled["postgres_active"] = activity.top(6)
            print(f"slow receivers, profiled round ({profiled['per_second']}/s): the engine thread's time "
                  f"({profiled['samples']} samples): {profiled['phases']}; the claimer thread's: "
                  f"{profiled['claimer']['phases']}; the recorder thread's: "
                  f"{profiled['recorder']['phases']}; PostgreSQL's backends at once, by statement and wait: "
                  f"{profiled['postgres_active']}", flush=True)
        result = {label: sorted(rows, key=lambda r: r["per_second"])[len(rows) // 2] for label, rows in runs.items()}
        if profiled:
            result["engine_profile"] = profiled
        result["runs"] = {label: [round(r["per_second"]) for r in rows] for label, rows in runs.items()}
        result.update(endpoints=endpoints, cap=cap, delay_ms=delay_ms, deliveries=per_endpoint * endpoints,
                      ideal_per_second=endpoints * cap * 1000 // delay_ms)
        self.results["slow_receivers"] = result
        for label in ("default", "100 in flight"):
            row = result[label]
            print(f"slow receivers ({endpoints} x cap {cap} x {delay_ms} ms, {label}): {row['per_second']:.0f} "
                  f"deliveries/s, {row['peak_in_flight']} in flight at most, {row['db_connections_peak']} PostgreSQL "
                  f"connections, worker peak RSS {row['worker_peak_rss_mb']} MB, {row['worker_cpu_ms']:.2f} ms CPU "
                  f"each, machine {row['machine_busy']:.0%} busy (runs {result['runs'][label]})", flush=True)
        self.cancel_backlog()

    def scaling(self):
        """Delivery throughput with 1, 2 and 4 worker processes, each `celery -A config worker` as the README starts
        it (100 threads): to a fast receiver (one endpoint, cap 1,000), and to 40 endpoints answering after 200 ms
        (default cap of 10 each, so up to 400 may be in flight)."""
        fast_count = self.size(2000, 600, 40)
        slow_count = self.size(2000, 800, 40)
        fast, _ = self.tenant_with_endpoints("scale-fast", ["/fast"], max_in_flight=1000)
        slow, _ = self.tenant_with_endpoints("scale-slow", [f"/delay/200/ep{n}" for n in range(40)])
        rows = []
        for workers in self.size((1, 2, 4), (1, 2, 4), (1, 2)):
            # due only once every worker is up, so all of them share the work from the first delivery
            self.make_deliveries(fast, fast_count)
            to_fast = self.drain(fast_count, f"scale{workers}f", workers=workers, fill=self.hold_outbox(workers))
            self.make_deliveries(slow, slow_count // 40)
            to_slow = self.drain(slow_count, f"scale{workers}s", workers=workers, fill=self.hold_outbox(workers))
            rows.append({"workers": workers, "fast": to_fast, "slow_200ms": to_slow})
            print(f"scaling: {workers} worker(s): fast {to_fast['per_second']:.0f}/s "
                  f"({to_fast['worker_cpu_ms']:.2f} ms CPU each), 200 ms receivers {to_slow['per_second']:.0f}/s "
                  f"({to_slow['peak_in_flight']} in flight at most)", flush=True)
        self.results["scaling"] = rows

    def brokers(self):
        """The fast-receiver drain on each broker: Redis, and RabbitMQ with classic queues without and with
        publisher confirms, and with quorum queues (confirms on). The worker's relay publishes (intake only rings
        the doorbell), so publishing, confirms included, is inside the measured span. Each RabbitMQ setting runs in
        a virtual host of its own (a queue's type cannot change in place); alternating rounds, medians."""
        count = self.size(2000, 600, 50)
        tenant, _ = self.tenant_with_endpoints("brokers", ["/fast"], max_in_flight=1000)
        rabbit = "amqp://guest:guest@127.0.0.1:5672/"
        configs = {
            "redis": {},
            "rabbitmq classic, no confirms": {"vhost": "herald-bench-classic", "HERALD_RABBITMQ_CONFIRM_PUBLISH": "false"},
            "rabbitmq classic, confirms": {"vhost": "herald-bench-classic-confirm"},
            "rabbitmq quorum, confirms": {"vhost": "herald-bench-quorum", "HERALD_RABBITMQ_QUEUE_TYPE": "quorum"},
        }
        if self.smoke:  # each virtual host is a few seconds of rabbitmqctl: one of them shows the path works
            configs = {name: configs[name] for name in ("redis", "rabbitmq quorum, confirms")}
        runs: dict[str, list[dict]] = {name: [] for name in configs}
        for name, config in configs.items():
            if "vhost" in config:
                subprocess.run(["rabbitmqctl", "delete_vhost", config["vhost"]], capture_output=True)
                subprocess.run(["rabbitmqctl", "add_vhost", config["vhost"]], check=True, capture_output=True)
                subprocess.run(["rabbitmqctl", "set_permissions", "-p", config["vhost"], "guest", ".*", ".*", ".*"],
                               check=True, capture_output=True)
        for round_ in range(self.size(3, 1, 1)):
            for name, config in abba(round_, configs.items()):
                env = {k: v for k, v in config.items() if k != "vhost"}
                if "vhost" in config:
                    env["CELERY_BROKER_URL"] = rabbit + config["vhost"]
                self.make_deliveries(tenant, count)
                runs[name].append(self.drain(count, "broker", **env))
        rows = {}
        for name, results in runs.items():
            median = sorted(results, key=lambda r: r["per_second"])[len(results) // 2]
            rows[name] = {**median, "runs": [round(r["per_second"]) for r in results]}
            print(f"brokers: {name}: {median['per_second']:.0f} deliveries/s (runs {rows[name]['runs']}), "
                  f"{median['worker_cpu_ms']:.2f} ms worker CPU each", flush=True)
        for config in configs.values():
            if "vhost" in config:
                subprocess.run(["rabbitmqctl", "delete_vhost", config["vhost"]], capture_output=True)
        self.results["brokers"] = rows

    def noisy_neighbour(self):
        """An endpoint that hangs past the timeout with 60 deliveries queued ahead; a healthy endpoint of the
        same tenant then gets an event every 100 ms through the API: its post-to-arrival latency."""
        import requests

        from webhooks.services.endpoints import endpoint_create

        tenant, token = self.tenant_with_endpoints("noisy", [])
        endpoint_create(tenant=tenant, url=f"{self.receiver.url}/hang/ep", event_types=["hang.*"], channels=[])
        endpoint_create(tenant=tenant, url=f"{self.receiver.url}/ok", event_types=["ok.*"], channels=[])
        self.make_deliveries(tenant, self.size(60, 60, 12), event_type="hang.thing")
        self.reset_receiver()
        procs = [stack.worker("noisy"), stack.beat()]
        session = requests.Session()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        sent: dict[str, float] = {}
        try:
            deadline = time.monotonic() + 30
            while self.receiver_stats()["peak_in_flight"].get("/hang/ep", 0) < 10 and time.monotonic() < deadline:
                time.sleep(0.05)
            duration = self.size(20, 10, 1)
            start = time.monotonic()
            for i in range(int(duration * 10)):
                delay = start + i / 10 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                response = session.post(f"{self.web.url}/api/v1/events", timeout=10, data=json.dumps(
                    {"type": "ok.thing", "data": {"n": i}}), headers={**headers, "Idempotency-Key": uuid.uuid4().hex})
                sent[response.json()["id"]] = time.time()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                stats = self.receiver_stats()
                if all(i in stats["received"] for i in sent):
                    break
                time.sleep(0.2)
        finally:
            for proc in reversed(procs):
                proc.stop(grace=2 if self.smoke else 10)  # its hanging attempts hold a warm shutdown to the grace
        latencies = [(stats["received"][i] - at) * 1000 for i, at in sent.items() if i in stats["received"]]
        result = {"events": len(sent), "arrived": len(latencies), "p50_ms": percentile(latencies, 50),
                  "p99_ms": percentile(latencies, 99), "max_ms": max(latencies, default=float("nan")),
                  "hanging_peak_in_flight": stats["peak_in_flight"].get("/hang/ep", 0), "samples_ms": latencies}
        self.results["noisy_neighbour"] = result
        print(f"noisy neighbour: healthy endpoint p50 {result['p50_ms']:.1f} ms p99 {result['p99_ms']:.1f} ms "
              f"({result['arrived']}/{result['events']} arrived); hanging endpoint at most "
              f"{result['hanging_peak_in_flight']} in flight", flush=True)
        self.cancel_backlog()

    # --- fairness across tenants (SPEC §10) -------------------------------------------------------------
    UNBOUNDED = {"WEBHOOK_PUBLISH_WINDOW": "100000000"}  # every due row published at once: today's FIFO

    def fairness(self):
        """Fair delivery across tenants, each figure in `--rounds` alternating rounds (medians) against the same
        build with the publish window unbounded (every due row published at once, first come first served, as
        before the scheduler):
        - quiet_behind_backlog: tenant A's backlog (N deliveries over 20 endpoints, fast receiver) is worked
          off by one worker; tenant B posts an event every 100 ms through the API; B's POST -> first attempt
          (Herald's own attempt `started_at`), p50/p99;
        - many_loud: 100 loud tenants with backlogs and 10 quiet ones posting in turn: the quiet p99;
        - weights: two tenants of weights 1 and 3 with backlogs, endpoints that take all the worker sends: the
          ratio of their attempts while both had deliveries waiting;
        - retrying_loud: tenant A's endpoints all answer 500 (retries due after 1 s, no jitter, the breaker
          off so that nothing parks them): once every first attempt of A's backlog has failed (or after 300 s:
          with the window unbounded, A's retries and first attempts interleave), B posts as in
          quiet_behind_backlog while A's retries go on;
        - alone: one tenant's backlog, deliveries/s (window on against unbounded);
        - scheduler_cost: one relay pass (room 500) over 1 to 10,000 tenants with backlogs: database time per
          delivery published."""
        rounds = max(1, min(self.rounds, 3))
        backlog = self.size(20_000, 4_000, 400)
        result: dict = {"backlog": backlog, "rounds": rounds}
        for key, measure in (("quiet_behind_backlog", self._fair_quiet), ("many_loud", self._fair_many),
                             ("retrying_loud", self._fair_retrying), ("weights", self._fair_weights),
                             ("alone", self._fair_alone)):
            if self.fairness_parts and key not in self.fairness_parts:
                continue
            runs: dict[str, list] = {"fair": [], "unbounded": []}
            for round_ in range(rounds):
                for mode in abba(round_, ("fair", "unbounded")):
                    runs[mode].append(measure(backlog, {} if mode == "fair" else self.UNBOUNDED))
                    self.cancel_backlog()
            result[key] = {mode: _median_of(values) for mode, values in runs.items()}
            result[key]["runs"] = runs
            print(f"fairness {key}: " + "; ".join(
                f"{mode} " + ", ".join(f"{k} {v:.3g}" for k, v in result[key][mode].items()) for mode in runs),
                flush=True)
        if not self.fairness_parts or "scheduler_cost" in self.fairness_parts:
            result["scheduler_cost"] = self._fair_cost()
            print("fairness scheduler cost (us per delivery published, by tenants with backlogs): " + ", ".join(
                f"{n}: {v:.1f}" for n, v in result["scheduler_cost"].items()), flush=True)
        self.results["fairness"] = result

    def _fair_backlog(self, tenant, endpoints: list[str], count: int) -> None:
        """`count` first attempts of `tenant` waiting in the outbox, as intake leaves them, over its endpoints."""
        from django.db import connection

        from datetime import datetime, timezone

        from webhooks import ids

        # ids as intake makes them now (in today's partitions): the time, then this backlog's tag and number
        tag, head = uuid.uuid4().hex[:8].upper(), ids.boundary("evt", datetime.now(timezone.utc))[4:14]
        with connection.cursor() as cursor:
            cursor.execute("""
                INSERT INTO webhooks_event (id, tenant_id, type, channels, payload, request_id, created_at)
                SELECT 'evt_' || %(head)s || %(tag)s || lpad(g::text, 8, '0'), %(tenant)s, 'invoice.paid', '{}',
                       '{"type":"invoice.paid","timestamp":"2026-01-01T00:00:00Z","data":{}}'::bytea, '', now()
                  FROM generate_series(1, %(events)s) g""",
                           {"tag": tag, "head": head, "tenant": tenant.pk, "events": -(-count // len(endpoints))})
            cursor.execute("""
                WITH made AS (
                    INSERT INTO webhooks_delivery (id, tenant_id, event_id, endpoint_id, status, attempt_count,
                                                   next_attempt_at, created_at, updated_at)
                    SELECT 'dlv_' || %(head)s || %(tag)s || lpad(((g - 1) / %(per)s + 1)::text, 8, '0')
                               || lpad(((g - 1) %% %(per)s + 1)::text, 5, '0'), %(tenant)s,
                           'evt_' || %(head)s || %(tag)s || lpad(((g - 1) / %(per)s + 1)::text, 8, '0'),
                           (%(endpoints)s::varchar[])[(g - 1) %% %(per)s + 1], 'pending', 0, now(), now(), now()
                      FROM generate_series(1, %(count)s) g
                    RETURNING id, tenant_id
                )
                INSERT INTO webhooks_deliveryoutbox (delivery_id, due_at, published_at, periodic, tenant_id)
                SELECT id, now(), NULL, false, tenant_id FROM made""",
                           {"tag": tag, "head": head, "tenant": tenant.pk, "per": len(endpoints), "endpoints": endpoints,
                            "count": count})
            cursor.execute("ANALYZE webhooks_deliveryoutbox")

    def _fair_tenant(self, name: str, paths: list[str], weight: int = 1, **options):
        from webhooks.models import Tenant

        tenant, token = self.tenant_with_endpoints(name, paths, **options)
        Tenant.objects.filter(pk=tenant.pk).update(delivery_weight=weight)
        return tenant, token, [e.pk for e in tenant.endpoints.order_by("id")]

    def _quiet_posts(self, tokens: list[str], seconds: float, until=None) -> dict[str, float]:
        """One event every 100 ms, the tokens in turn, through the API; {event id: time posted}."""
        import requests

        session = requests.Session()
        sent: dict[str, float] = {}
        start = time.monotonic()
        for i in range(int(seconds * 10)):
            if until is not None and until():
                break
            delay = start + i / 10 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            posted = time.time()
            response = session.post(f"{self.web.url}/api/v1/events", timeout=10, data=json.dumps(
                {"type": "quiet.thing", "data": {"n": i}}), headers={
                    "Authorization": f"Bearer {tokens[i % len(tokens)]}", "Content-Type": "application/json",
                    "Idempotency-Key": uuid.uuid4().hex})
            sent[response.json()["id"]] = posted
        return sent

    @staticmethod
    def _first_attempt_waits_ms(sent: dict[str, float], timeout: float = 120) -> list[float]:
        from webhooks.models import DeliveryAttempt

        deadline = time.monotonic() + timeout
        while True:
            rows = list(DeliveryAttempt.objects.filter(delivery__event_id__in=list(sent), number=1).values_list(
                "delivery__event_id", "started_at"))
            if len(rows) >= len(sent) or time.monotonic() > deadline:
                return [(at.timestamp() - sent[event]) * 1000 for event, at in rows]
            time.sleep(0.2)

    def _pending(self, tenants) -> int:
        from webhooks.models import Delivery

        return Delivery.objects.filter(tenant__in=tenants, status=Delivery.PENDING).count()

    def _fair_quiet(self, backlog: int, env: dict) -> dict:
        loud, _, endpoints = self._fair_tenant("loud", [f"/loud/{n}" for n in range(20)])
        _, quiet_token, _ = self._fair_tenant("quiet", ["/quiet"])
        self._fair_backlog(loud, endpoints, backlog)
        worker = stack.worker("fair", **env)
        try:
            started = time.monotonic()
            while self._pending([loud]) > backlog * 0.95 and time.monotonic() - started < 60:
                time.sleep(0.05)
            sent = self._quiet_posts([quiet_token], 20 if self.quick else 40,
                                     until=lambda: self._pending([loud]) < backlog * 0.1)
            waits = self._first_attempt_waits_ms(sent)
        finally:
            worker.stop()
        return {"p50_ms": percentile(waits, 50), "p99_ms": percentile(waits, 99), "max_ms": max(waits, default=float("nan")),
                "posts": len(sent)}

    def _fair_many(self, backlog: int, env: dict) -> dict:
        loud, louds = [], self.size(100, 100, 5)
        for n in range(louds):
            tenant, _, endpoints = self._fair_tenant(f"loud{n}", [f"/many/{n}"])
            self._fair_backlog(tenant, endpoints, backlog // louds)
            loud.append(tenant)
        tokens = [self._fair_tenant(f"quiet{n}", [f"/quiet/{n}"])[1] for n in range(self.size(10, 10, 2))]
        worker = stack.worker("fair", **env)
        try:
            started = time.monotonic()
            while self._pending(loud) > backlog * 0.95 and time.monotonic() - started < 60:
                time.sleep(0.05)
            sent = self._quiet_posts(tokens, 20 if self.quick else 40, until=lambda: self._pending(loud) < backlog * 0.1)
            waits = self._first_attempt_waits_ms(sent)
        finally:
            worker.stop()
        return {"p50_ms": percentile(waits, 50), "p99_ms": percentile(waits, 99), "posts": len(sent)}

    # A's retries as fast as they come: due a second after each failure, none parked by the breaker
    RETRYING = {"WEBHOOK_RETRY_SCHEDULE": ",".join(["1"] * 20), "WEBHOOK_RETRY_JITTER": "0",
                "WEBHOOK_BREAKER_FAILURES": "1000000000"}

    def _fair_retrying(self, backlog: int, env: dict) -> dict:
        from webhooks.models import DeliveryAttempt

        loud, _, endpoints = self._fair_tenant("failing", [f"/fail/{n}" for n in range(20)])
        _, quiet_token, _ = self._fair_tenant("quiet", ["/quiet"])
        self._fair_backlog(loud, endpoints, backlog)
        worker = stack.worker("fair", **self.RETRYING, **env)
        try:
            started = time.monotonic()
            # every first attempt failed: what A has waiting now is retries
            while (DeliveryAttempt.objects.filter(delivery__tenant=loud, number=1).count() < backlog
                   and time.monotonic() - started < 300):
                time.sleep(0.2)
            retries_before = DeliveryAttempt.objects.filter(delivery__tenant=loud, number__gt=1).count()
            sent = self._quiet_posts([quiet_token], self.size(40, 20, 3))
            waits = self._first_attempt_waits_ms(sent)
            retries = DeliveryAttempt.objects.filter(delivery__tenant=loud, number__gt=1).count() - retries_before
        finally:
            worker.stop()
        return {"p50_ms": percentile(waits, 50), "p99_ms": percentile(waits, 99),
                "max_ms": max(waits, default=float("nan")), "posts": len(sent), "loud_retries_meanwhile": retries}

    def _fair_weights(self, backlog: int, env: dict) -> dict:
        from webhooks.models import DeliveryAttempt

        light, _, light_endpoints = self._fair_tenant("light", ["/light"], weight=1, max_in_flight=1000)
        heavy, _, heavy_endpoints = self._fair_tenant("heavy", ["/heavy"], weight=3, max_in_flight=1000)
        self._fair_backlog(light, light_endpoints, backlog // 2)
        self._fair_backlog(heavy, heavy_endpoints, backlog // 2)
        worker = stack.worker("fair", **env)
        try:
            while self._pending([heavy]) > backlog // 4:
                time.sleep(0.1)
        finally:
            worker.stop()
        heavy_at = sorted(DeliveryAttempt.objects.filter(delivery__tenant=heavy).values_list("started_at", flat=True))
        since, until = heavy_at[len(heavy_at) // 10], heavy_at[-1]
        light_n = DeliveryAttempt.objects.filter(delivery__tenant=light, started_at__gte=since,
                                                 started_at__lte=until).count()
        heavy_n = sum(1 for at in heavy_at if since <= at <= until)
        return {"light_per_heavy": light_n / heavy_n, "light": light_n, "heavy": heavy_n}

    def _fair_alone(self, backlog: int, env: dict) -> dict:
        alone, _, endpoints = self._fair_tenant("alone", [f"/alone/{n}" for n in range(20)])
        self._fair_backlog(alone, endpoints, backlog)
        self.reset_receiver()
        worker = stack.worker("fair", **env)
        try:
            while self.receiver_stats()["count"] < backlog:
                time.sleep(0.1)
            stats = self.receiver_stats()
        finally:
            worker.stop()
        return {"per_second": (stats["count"] - 1) / (stats["last"] - stats["first"])}

    def _fair_cost(self) -> dict:
        """Database time of the relay's passes (window count, walk, take), per delivery published, with 1 to
        10,000 tenants that each have a backlog (100,000 rows in all; nothing is sent: each pass's marks are
        rolled back, so every pass sees the same backlog from a rotation that moves on)."""
        from django.db import connection, transaction

        from webhooks.delivery import scheduling
        from webhooks.models import Tenant

        costs = {}
        _, _, (endpoint_id,) = self._fair_tenant("cost", ["/cost"])
        total = self.size(100_000, 100_000, 1_000)
        for tenants in self.size((1, 10, 100, 1_000, 10_000), (1, 10, 100, 1_000, 10_000), (1, 10)):
            self.cancel_backlog()
            with connection.cursor() as cursor:
                cursor.execute("""INSERT INTO webhooks_tenant (id, name, metadata, delivery_weight, created_at)
                                  SELECT 'tnt_cost' || lpad(g::text, 6, '0'), 'cost', '{}', 1, now()
                                    FROM generate_series(1, %s) g ON CONFLICT DO NOTHING""", [tenants])
            owners = list(Tenant.objects.filter(pk__startswith="tnt_cost").order_by("pk").values_list("pk", flat=True)
                          [:tenants])
            # the deliveries' endpoint plays no part in the choice: one endpoint serves them all
            endpoint_of = dict.fromkeys(owners, endpoint_id)
            with connection.cursor() as cursor:
                cursor.execute("""
                    INSERT INTO webhooks_event (id, tenant_id, type, channels, payload, request_id, created_at)
                    SELECT 'evt_cost' || t.n || '_' || g, t.id, 'x', '{}', '{}'::bytea, '', now()
                      FROM unnest(%(tenants)s::varchar[]) WITH ORDINALITY AS t(id, n),
                           generate_series(1, %(per)s) g""", {"tenants": list(endpoint_of), "per": total // tenants})
                cursor.execute("""
                    WITH made AS (
                        INSERT INTO webhooks_delivery (id, tenant_id, event_id, endpoint_id, status, attempt_count,
                                                       next_attempt_at, created_at, updated_at)
                        SELECT 'dlv_cost' || t.n || '_' || g, t.id, 'evt_cost' || t.n || '_' || g, t.endpoint,
                               'pending', 0, now(), now(), now()
                          FROM unnest(%(tenants)s::varchar[], %(endpoints)s::varchar[]) WITH ORDINALITY AS t(id, endpoint, n),
                               generate_series(1, %(per)s) g
                        RETURNING id, tenant_id, created_at
                    )
                    INSERT INTO webhooks_deliveryoutbox (delivery_id, due_at, published_at, periodic, tenant_id)
                    SELECT id, created_at, NULL, false, tenant_id FROM made""",
                               {"tenants": list(endpoint_of), "endpoints": list(endpoint_of.values()),
                                "per": total // tenants})
                cursor.execute("VACUUM ANALYZE webhooks_deliveryoutbox")
            scheduler = scheduling.Scheduler()
            timer, taken = SqlTimer(), 0
            with connection.execute_wrapper(timer):
                for _ in range(self.size(30, 30, 2)):
                    with transaction.atomic():
                        taken += len(scheduler.take(min(1000, scheduler.room(window=500))).rows)
                        transaction.set_rollback(True)
            costs[tenants] = sum(timer.spent) * 1e6 / taken
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM webhooks_deliveryoutbox WHERE delivery_id LIKE 'dlv_cost%%'")
                cursor.execute("DELETE FROM webhooks_delivery WHERE id LIKE 'dlv_cost%%'")
                cursor.execute("DELETE FROM webhooks_event WHERE id LIKE 'evt_cost%%'")
        return costs

    def end_to_end(self):
        import requests

        workers = stack.worker("e2e")
        session = requests.Session()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        body = json.dumps({"type": "invoice.paid", "data": {"invoice": "in_1"}})
        sent: dict[str, float] = {}
        lock = threading.Lock()

        def post(session):
            response = session.post(f"{self.web.url}/api/v1/events", data=body, timeout=10,
                                    headers={**headers, "Idempotency-Key": uuid.uuid4().hex})
            at = time.time()
            with lock:
                sent[response.json()["id"]] = at

        def latencies(ids):
            deadline = time.monotonic() + 60
            while True:
                received = self.receiver_stats()["received"]
                if all(i in received for i in ids) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            return [(received[i] - sent[i]) * 1000 for i in ids if i in received], len(ids)

        try:
            self.reset_receiver()
            idle_n = self.size(100, 40, 5)
            for _ in range(idle_n):
                post(session)
                time.sleep(0.05)
            idle, n_idle = latencies(list(sent))
            # half the delivery part's rate (100/s when it did not run in this process: `--only end_to_end`)
            delivered = self.results["delivery"][-1]["herald"]["per_second"] if "delivery" in self.results else 200
            rate = max(10.0, 0.5 * delivered)
            rate = min(rate, 20.0) if self.smoke else rate
            sent.clear()
            self.reset_receiver()
            duration = self.size(10, 5, 1)
            sessions = [requests.Session() for _ in range(8)]
            with ThreadPoolExecutor(8) as pool:
                start = time.monotonic()
                for i in range(int(rate * duration)):
                    delay = start + i / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    pool.submit(post, sessions[i % 8])
            loaded, n_loaded = latencies(list(sent))
        finally:
            workers.stop()
        self.results["end_to_end"] = {
            "idle": {"events": n_idle, "p50_ms": percentile(idle, 50), "p99_ms": percentile(idle, 99)},
            "loaded": {"events": n_loaded, "rate_per_s": rate, "p50_ms": percentile(loaded, 50),
                       "p99_ms": percentile(loaded, 99)},
            "idle_samples_ms": idle, "loaded_samples_ms": loaded,
        }
        print(f"end-to-end idle p50 {percentile(idle, 50):.1f} ms p99 {percentile(idle, 99):.1f} ms; "
              f"at {rate:.0f}/s p50 {percentile(loaded, 50):.1f} ms p99 {percentile(loaded, 99):.1f} ms", flush=True)

    def fan_out(self):
        from intake.credentials import credential_create

        rows = []
        total = self.size(1000, 300, 100)
        for fan in (1, 10, 100):
            credential, token = credential_create(tenant_name=f"fan-{fan}")
            self.endpoints(credential.tenant, fan)
            result = wrk(self.web.url + "/api/v1/events", mode="first", token=token, path="/api/v1/events",
                         connections=16, seconds=self.seconds)
            self.cancel_backlog()
            self.make_deliveries(credential.tenant, max(1, total // fan))
            drained = self.drain(max(1, total // fan) * fan, f"fanout{fan}")
            rows.append({"endpoints": fan, "intake_rps": result["rps"], "intake_p50_ms": result["p50_ms"],
                         "intake_p99_ms": result["p99_ms"], "deliveries_per_second": drained["per_second"]})
            print(f"fan-out {fan:3}: intake {result['rps']:.0f} req/s p99 {result['p99_ms']:.1f} ms, "
                  f"{drained['per_second']:.0f} deliveries/s", flush=True)
        self.results["fan_out"] = rows

    def cost(self):
        """What one delivered event costs (CPU by process, rows, index entries, WAL, statements, broker commands),
        fan-out 1 and 20, on a stack of its own: bench/cost.py."""
        from bench import cost

        self.results["cost"] = cost.measure(self)

    def prune(self):
        from django.db import connection

        from intake.idempotency.prune import keys_prune_expired

        rows = self.size(1_000_000, 200_000, 2_000)

        def fill():
            with connection.cursor() as cursor:
                cursor.execute("""
                    INSERT INTO intake_idempotencykey (credential_id, key, fingerprint, method, path,
                        response_status, response_headers, response_body, response_encrypted, created_at,
                        expires_at)
                    SELECT %s, 'old-' || g || '-' || %s, repeat('0', 64), 'POST', '/api/v1/events',
                        202, '[]'::jsonb, '\\x7b7d'::bytea, false, now() - interval '2 days',
                        now() - interval '1 day'
                    FROM generate_series(1, %s) g""", [self.credential.id, uuid.uuid4().hex[:6], rows])
                cursor.execute("ANALYZE intake_idempotencykey")

        fill()
        started = time.monotonic()
        deleted, batches = keys_prune_expired(batch_size=5000)
        alone = time.monotonic() - started
        baseline = wrk(self.web.url + "/api/v1/events", mode="first", token=self.token, path="/api/v1/events",
                       connections=16, seconds=self.seconds)
        self.cancel_backlog()
        fill()
        during_result = {}
        thread = threading.Thread(target=lambda: during_result.update(wrk(
            self.web.url + "/api/v1/events", mode="first", token=self.token, path="/api/v1/events",
            connections=16, seconds=max(2.0, min(self.seconds, alone)))))
        thread.start()
        started = time.monotonic()
        keys_prune_expired(batch_size=5000)
        loaded_prune = time.monotonic() - started
        thread.join()
        self.cancel_backlog()
        self.results["prune"] = {
            "rows": deleted, "batches": batches, "seconds": alone, "rows_per_second": deleted / alone,
            "seconds_under_intake_load": loaded_prune,
            "intake_p99_ms_without": baseline["p99_ms"], "intake_p99_ms_during": during_result["p99_ms"],
            "p99_ratio": during_result["p99_ms"] / baseline["p99_ms"],
        }
        print(f"prune {deleted} rows in {alone:.2f}s = {deleted / alone:.0f} rows/s; intake p99 "
              f"{baseline['p99_ms']:.1f} ms without, {during_result['p99_ms']:.1f} ms during", flush=True)

    def dispatch(self):
        """Beat's dispatcher on a large table: 1M pending deliveries scheduled for later and 10k due
        (seeded with generate_series), a queue backlog it must leave alone, and the rate at which
        retries coming due are published and sent."""
        from datetime import timedelta

        from django.conf import settings
        from django.db import connection
        from django.test import override_settings
        from django.utils import timezone

        from webhooks import ids, progress
        from webhooks.delivery.publishing import publish
        from webhooks.delivery.dispatcher import deliveries_dispatch_due

        waiting, due, backlog = self.size((1_000_000, 10_000, 100_000), (100_000, 10_000, 20_000), (1_000, 100, 200))
        self.cancel_backlog()
        tenant, _ = self.tenant_with_endpoints("dispatch", [f"/dispatch/{n}" for n in range(100)],
                                               max_in_flight=100)
        events_needed = (waiting + due + backlog) // 100 + 1
        with connection.cursor() as cursor:
            # ids as intake made them an hour ago (in today's partitions): that time, and the number as the random part
            head = "evt_" + ids.boundary("evt", timezone.now() - timedelta(hours=1))[4:14]
            cursor.execute("""
                INSERT INTO webhooks_event (id, tenant_id, type, channels, payload, request_id, created_at)
                SELECT %s || lpad(g::text, 16, '0'), %s, 'invoice.paid', '{}',
                       '{"type":"invoice.paid","timestamp":"2026-01-01T00:00:00Z","data":{}}'::bytea, '',
                       now() - interval '1 hour'
                  FROM generate_series(1, %s) g""", [head, tenant.pk, events_needed])
            # rank r of (event, endpoint): the first `waiting` are retries for later, then `due` retries due
            # now, then the `backlog`: first attempts published ten minutes ago, waiting in the main queue.
            cursor.execute("""
                INSERT INTO webhooks_delivery (id, tenant_id, event_id, endpoint_id, status, attempt_count,
                                               next_attempt_at, created_at, updated_at)
                SELECT 'dlv_' || substr(e.id, 5) || lpad(x.rank::text, 5, '0'), %(tenant)s, e.id, ep.id, 'pending',
                       CASE WHEN r <= %(waiting)s + %(due)s THEN 1 ELSE 0 END,
                       CASE WHEN r <= %(waiting)s THEN now() + interval '1 hour'
                            WHEN r <= %(waiting)s + %(due)s THEN now() - interval '1 second'
                            ELSE now() - interval '10 minutes' END,
                       now() - interval '10 minutes', now()
                  FROM (SELECT e.id AS event_id, ep.id AS endpoint_id,
                               row_number() OVER (ORDER BY e.id, ep.id) AS r,
                               row_number() OVER (PARTITION BY e.id ORDER BY ep.id) AS rank
                          FROM webhooks_event e CROSS JOIN webhooks_endpoint ep
                         WHERE e.tenant_id = %(tenant)s AND ep.tenant_id = %(tenant)s) x
                  JOIN webhooks_event e ON e.id = x.event_id JOIN webhooks_endpoint ep ON ep.id = x.endpoint_id
                 WHERE r <= %(total)s""", {"tenant": tenant.pk, "waiting": waiting, "due": due,
                                            "total": waiting + due + backlog})
            # their outbox rows, as records of failed attempts and the relay's publishing left them
            cursor.execute("""
                INSERT INTO webhooks_deliveryoutbox (delivery_id, due_at, published_at, periodic)
                SELECT id, next_attempt_at, CASE WHEN attempt_count = 0 THEN next_attempt_at END, attempt_count > 0
                  FROM webhooks_delivery WHERE tenant_id = %s""", [tenant.pk])
            cursor.execute("VACUUM ANALYZE webhooks_delivery")
            cursor.execute("VACUUM ANALYZE webhooks_deliveryoutbox")
            cursor.execute("""SELECT delivery_id FROM webhooks_deliveryoutbox
                               WHERE published_at IS NOT NULL ORDER BY delivery_id""")
            backlog_ids = [row[0] for row in cursor.fetchall()]
        # The backlog's messages wait in the main queue; the workers have consumed up to twenty minutes
        # ago (they are busy with older work): the backlog is still waiting, not lost.
        self.purge_queue()
        periodic = settings.HERALD_PERIODIC_QUEUE
        import redis

        client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        client.delete(periodic)
        publish([(settings.CELERY_TASK_DEFAULT_QUEUE, backlog_ids, self._db_now() - timedelta(minutes=10))])
        # (marks only move forward: the earlier sections' workers left newer ones, which a FIFO queue holding
        # this backlog could not have produced, so the table starts afresh)
        from webhooks.models import QueueProgress

        QueueProgress.objects.all().delete()
        progress.flush({settings.CELERY_TASK_DEFAULT_QUEUE: self._db_now() - timedelta(minutes=20)})

        timed = SqlTimer()
        spent = timed.spent
        # The publish window opened to hold the backlog and the due retries: this part measures the
        # dispatcher's pass over a large table, not the window (docs/design.md, "How a delivery is chosen"),
        # whatever rule the window keeps for rows published long ago.
        window = override_settings(WEBHOOK_PUBLISH_WINDOW=waiting + due + backlog)
        window.enable()

        started = time.perf_counter()
        with connection.execute_wrapper(timed):
            published = deliveries_dispatch_due(batch=settings.WEBHOOK_DISPATCH_BATCH)
        run_ms = (time.perf_counter() - started) * 1000
        db_ms = sum(spent) * 1000
        republished = len(set(published) & set(backlog_ids))
        print(f"dispatch: {waiting:,} waiting + {due:,} due: one run {db_ms:.0f} ms of database time, "
              f"{run_ms:.0f} ms in all, published {len(published):,}; backlog republished {republished}", flush=True)

        # The queue is flushed: the backlog is lost now. The retries just published go out (two workers as
        # the README starts them), and the next run publishes the backlog again.
        self.purge_queue()
        drained = self.drain(due, "dispatch", workers=2)
        with connection.execute_wrapper(timed):
            recovered = deliveries_dispatch_due(batch=settings.WEBHOOK_DISPATCH_BATCH)
        window.disable()
        client.delete(periodic)
        recovered_backlog = len(set(recovered) & set(backlog_ids))
        self.results["dispatch"] = {
            "waiting": waiting, "due": due, "backlog": len(backlog_ids), "db_ms": db_ms, "run_ms": run_ms,
            "published": len(published), "backlog_republished": republished,
            "retries": due, "retries_per_second": drained["per_second"], "workers": 2,
            "publish_per_second": len(published) / (run_ms / 1000),
            "after_flush_republished": recovered_backlog,
        }
        print(f"dispatch: {due:,} retries sent at {drained['per_second']:.0f}/s by two workers; after a queue "
              f"flush the next run republished {recovered_backlog:,} of the {len(backlog_ids):,} backlog", flush=True)
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE webhooks_deliveryattempt, webhooks_deliverylease, webhooks_deliveryoutbox, "
                           "webhooks_delivery, webhooks_event CASCADE")

    HISTORY_DAYS = 60  # the seeded history's depth: retention (30 days) drops 30 of them

    def seed_history(self, name: str, events: int, days: int = HISTORY_DAYS):
        """History as a platform's would be, `events` deep with 4 deliveries each, spread evenly over the `days`
        days before today, each row in its day's partition (its id as intake made it that day): (tenant,
        deliveries, events that retention must keep, seconds it took). One in 20 deliveries failed, the rest
        succeeded, but for the last two days, where one event in 50 still has its deliveries pending (retries
        scheduled), and one in 10,000 older ones (a long outage's): retention moves those on instead of
        dropping them. Every delivery has one attempt."""
        from datetime import datetime, timedelta, timezone

        from django.db import connection

        from webhooks import ids
        from webhooks.services import partitions

        tenant, _ = self.tenant_with_endpoints(name, [f"/{name}/{n}" for n in range(4)])
        self.cancel_backlog()
        started = time.monotonic()
        today = partitions.today()
        partitions.ensure(first=today - timedelta(days=days))
        noons = [datetime.combine(today - timedelta(days=d), datetime.min.time(), tzinfo=timezone.utc)
                 + timedelta(hours=12) for d in range(1, days + 1)]
        # an event's id: its day's time (10 characters of the ULID) and its number as the random part
        heads = [ids.boundary("evt", noon)[4:14] for noon in noons]
        with connection.cursor() as cursor:
            cursor.execute("""
                INSERT INTO webhooks_event (id, tenant_id, type, channels, payload, request_id, created_at)
                SELECT 'evt_' || (%(heads)s::text[])[g %% %(days)s + 1] || lpad(g::text, 16, '0'), %(tenant)s,
                       'invoice.' || (g %% 7), '{}',
                       convert_to('{"type":"invoice.paid","timestamp":"2025-01-01T00:00:00.000000Z","data":{"n":'
                                  || g || '}}', 'UTF8'), '', (%(noons)s::timestamptz[])[g %% %(days)s + 1]
                  FROM generate_series(1, %(events)s) g""",
                           {"tenant": tenant.pk, "events": events, "heads": heads, "noons": noons, "days": days})
            cursor.execute("""
                INSERT INTO webhooks_delivery (id, tenant_id, event_id, endpoint_id, status, attempt_count,
                                               next_attempt_at, created_at, updated_at)
                SELECT 'dlv_' || substr(e.id, 5) || lpad(ep.n::text, 5, '0'), %(tenant)s, e.id, ep.id,
                       CASE WHEN e.pending THEN 'pending' WHEN e.g %% 20 = 0 THEN 'failed' ELSE 'succeeded' END,
                       1, CASE WHEN e.pending THEN now() + interval '1 hour' END, e.created_at, e.created_at
                  FROM (SELECT id, created_at, g,
                               CASE WHEN created_at > now() - interval '3 days' THEN g %% 50 = 0
                                    ELSE g %% 10000 = 0 END AS pending
                          FROM (SELECT id, created_at, right(id, 16)::bigint AS g FROM webhooks_event
                                 WHERE tenant_id = %(tenant)s) x) e
                 CROSS JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM webhooks_endpoint
                              WHERE tenant_id = %(tenant)s) ep""", {"tenant": tenant.pk})
            cursor.execute("""
                INSERT INTO webhooks_deliveryattempt (delivery_id, number, started_at, duration_ms, response_status,
                                                      response_body, error, created_at)
                SELECT id, 1, created_at, 12, CASE WHEN status = 'failed' THEN 500 ELSE 200 END, 'ok', '', created_at
                  FROM webhooks_delivery WHERE tenant_id = %(tenant)s""", {"tenant": tenant.pk})
            cursor.execute("""
                INSERT INTO webhooks_deliveryoutbox (delivery_id, due_at, published_at, periodic, tenant_id)
                SELECT id, next_attempt_at, NULL, true, tenant_id FROM webhooks_delivery
                 WHERE tenant_id = %(tenant)s AND status = 'pending'""", {"tenant": tenant.pk})
            cursor.execute("VACUUM ANALYZE webhooks_event, webhooks_delivery, webhooks_deliveryattempt, "
                           "webhooks_deliveryoutbox")
            cursor.execute("SELECT count(*) FROM webhooks_delivery WHERE tenant_id = %s", [tenant.pk])
            deliveries = cursor.fetchone()[0]
            # what retention (30 days, whole partitions) must keep: the partitions not wholly past the cutoff, and
            # every event with a delivery still pending
            gone = partitions.droppable(datetime.now(timezone.utc) - timedelta(days=30))
            cursor.execute("""SELECT count(*) FROM webhooks_event e WHERE e.tenant_id = %(tenant)s
                               AND (e.created_at >= %(kept_from)s
                                    OR EXISTS (SELECT 1 FROM webhooks_delivery d
                                                WHERE d.event_id = e.id AND d.status = 'pending'))""",
                           {"tenant": tenant.pk, "kept_from": gone[-1].stop() if gone else noons[-1]})
            must_stay = cursor.fetchone()[0]
        seeded = time.monotonic() - started
        print(f"{name}: seeded {events:,} events, {deliveries:,} deliveries and as many attempts over {days} days "
              f"in {seeded:.0f} s", flush=True)

        return tenant, deliveries, must_stay, seeded

    def drop_history(self):
        """The seeded history goes, with the partitions of its days older than retention's."""
        from datetime import timedelta

        from django.db import connection

        from webhooks.conf import herald_settings
        from webhooks.services import partitions

        self.cancel_backlog()
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE webhooks_deliveryattempt, webhooks_deliverylease, webhooks_deliveryoutbox, "
                           "webhooks_delivery, webhooks_event CASCADE")
        kept_from = partitions.today() - timedelta(days=herald_settings.retention.EVENT_RETENTION_DAYS)
        for span in partitions.spans():
            if span.end <= kept_from:  # back to the partitions a live system has (setup)
                partitions.drop(span)
        partitions.ensure(first=kept_from)

    def scrape(self):
        """/metrics at 10M deliveries: the year's history seeded twice as deep (2.5M events), then the
        database time of whole scrapes of /metrics (every statement the view runs), median of 9."""
        from django.test import Client

        events = self.size(2_500_000, 250_000, 500)
        _, deliveries, _, seeded = self.seed_history("scrape", events)
        client = Client()

        def scrape():
            response = client.get("/metrics")
            assert response.status_code == 200, response.status_code

        db_ms = SqlTimer.db_ms(scrape, runs=9)
        self.results["scrape"] = {"events": events, "deliveries": deliveries, "seed_seconds": seeded, "db_ms": db_ms}
        print(f"scrape: /metrics took {db_ms:.1f} ms of database time on {deliveries:,} deliveries", flush=True)
        self.drop_history()

    def year(self):
        """History at scale: 10M deliveries (seeded with generate_series) under 2.5M events over 60 days, each day
        in its partitions (`seed_history`); the database time of /metrics' gauges and of the admin's lists on it;
        then retention as beat runs it: alone on the oldest 15 days, then on the next 15 while wrk drives intake,
        against intake without it just before. Retention drops whole days (webhooks/services/partitions.py): its
        figure is the database time (every statement's round trip) per day dropped."""
        from django.conf import settings
        from django.contrib.auth.models import User
        from django.db import connection
        from django.test import Client

        from webhooks.delivery.metrics import DeliveryStateCollector
        from webhooks.models import Delivery
        from webhooks.services.retention import events_prune

        events = self.size(2_500_000, 250_000, 500)
        tenant, deliveries, must_stay, seeded = self.seed_history("year", events)
        pending_seeded = Delivery.objects.filter(tenant=tenant, status=Delivery.PENDING).count()
        db_ms = SqlTimer.db_ms

        reads = {"metrics": db_ms(lambda: list(DeliveryStateCollector().collect()))}
        admin, _ = User.objects.get_or_create(username="bench-admin", defaults={"is_staff": True,
                                                                                "is_superuser": True})
        client = Client()
        client.force_login(admin)
        for name, query in (("admin deliveries", ""), ("admin deliveries, failed", "?status__exact=failed"),
                            ("admin deliveries, one event type", "?event__type=invoice.3"),
                            ("admin events", None)):
            url = "/admin/webhooks/event/" if query is None else "/admin/webhooks/delivery/" + query

            def page(url=url):
                response = client.get(url)
                assert response.status_code == 200, (url, response.status_code)

            reads[name] = db_ms(page)
        for name, ms in reads.items():
            print(f"year: {name}: {ms:.1f} ms of database time on {deliveries:,} deliveries", flush=True)

        def prune(days: int) -> tuple:
            """Retention with `days`, its database time (seconds) and the result."""
            timer = SqlTimer()
            with connection.execute_wrapper(timer):
                pruned = events_prune(days=days, max_seconds=3600)
            return pruned, sum(timer.spent)

        alone, alone_db = prune(self.HISTORY_DAYS - 15)
        baseline = wrk(self.web.url + "/api/v1/events", mode="first", token=self.token, path="/api/v1/events",
                       connections=16, seconds=self.seconds)
        result = {}
        pruner = threading.Thread(target=lambda: result.update(zip(("pruned", "db"), prune(30))))
        pruner.start()
        time.sleep(0.2)
        during = wrk(self.web.url + "/api/v1/events", mode="first", token=self.token, path="/api/v1/events",
                     connections=16, seconds=self.seconds)
        pruner.join()
        pruned, pruned_db = result["pruned"], result["db"]
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM webhooks_event WHERE tenant_id = %s", [tenant.pk])
            left = cursor.fetchone()[0]
            cursor.execute("SELECT count(*) FROM webhooks_delivery WHERE tenant_id = %s AND status = 'pending'",
                           [tenant.pk])
            pending_left = cursor.fetchone()[0]
        self.results["year"] = {
            "events": events, "deliveries": deliveries, "history_days": self.HISTORY_DAYS,
            "partition_days": settings.HISTORY_PARTITION_DAYS, "seed_seconds": seeded,
            "reads_db_ms": reads, "pause_ratio": settings.EVENT_RETENTION_PAUSE_RATIO,
            "alone_days": alone.days, "alone_rows": alone.rows, "alone_seconds": alone.seconds,
            "alone_db_seconds": alone_db, "alone_db_seconds_per_day": alone_db / max(1, alone.days),
            "pruned_days": pruned.days, "pruned_rows": pruned.rows, "pruned_events": pruned.events,
            "prune_seconds": pruned.seconds, "prune_db_seconds": pruned_db,
            "prune_db_seconds_per_day": pruned_db / max(1, pruned.days),
            "moved_on_events": alone.moved + pruned.moved, "kept_events": left, "must_stay": must_stay,
            "pending_left": pending_left, "pending_seeded": pending_seeded,
            "intake_p99_ms_without": baseline["p99_ms"], "intake_p99_ms_during": during["p99_ms"],
            "p99_ratio": during["p99_ms"] / baseline["p99_ms"],
        }
        print(f"year: retention (pause ratio {settings.EVENT_RETENTION_PAUSE_RATIO:g}) alone dropped {alone.days} days "
              f"({alone.rows:,} rows) in {alone.seconds:.1f} s, {alone_db:.2f} s of database time "
              f"({alone_db / max(1, alone.days) * 1000:.0f} ms a day); under intake load {pruned.days} days "
              f"({pruned.rows:,} rows) in {pruned.seconds:.1f} s, {pruned_db:.2f} s of database time "
              f"({pruned_db / max(1, pruned.days) * 1000:.0f} ms a day); moved on {alone.moved + pruned.moved:,} events "
              f"with a pending delivery; kept {left:,} events ({must_stay:,} had to stay), {pending_left:,} pending "
              f"deliveries; intake p99 {baseline['p99_ms']:.1f} ms without, {during['p99_ms']:.1f} ms during",
              flush=True)
        self.drop_history()

    def erasure(self):
        """Erasure of a deleted tenant (SPEC §10) under intake load. Each of `--rounds` rounds (default 5) seeds
        a tenant with the year's history (`seed_history`): 250,000 events to 4 endpoints, 1,000,000
        deliveries and 1,000,000 attempts, one in fifty events with its deliveries pending (and their outbox
        rows), and an idempotency key per event; deletes it (tenant_delete) and runs beat's erasure
        (tenants_erase, EVENT_RETENTION_PAUSE_RATIO as configured) to the end. wrk drives intake for another
        tenant for one run without the erasure (before it in even rounds, after it in odd ones) and one during it:
        the p99 ratio is of the rounds' medians,
        the rows/s each round's whole erasure (every row it deleted, over its wall time)."""
        from datetime import timedelta

        from django.conf import settings
        from django.db import connection
        from django.utils import timezone

        from intake.models import ApiCredential
        from intake.tenants import erasure_grace, tenant_delete, tenants_erase
        from webhooks.models import Tenant

        events = self.size(250_000, 25_000, 500)
        rounds: dict[str, list[dict]] = {"without": [], "during": []}
        erasures, seeds = [], []
        for n in range(self.rounds):
            tenant, _, _, seeded = self.seed_history(f"erasure{n}", events)
            credential = ApiCredential.objects.filter(tenant=tenant).get()
            started = time.monotonic()
            with connection.cursor() as cursor:
                # the answer intake stored for each of its events, as a platform's retries would find it
                cursor.execute("""
                    INSERT INTO intake_idempotencykey (credential_id, key, fingerprint, method, path,
                        response_status, response_headers, response_body, response_encrypted, created_at,
                        expires_at)
                    SELECT %(credential)s, 'evt-' || g, md5(g::text) || md5(g::text), 'POST', '/api/v1/events', 202,
                           '[["Content-Type", "application/json"], ["Location", "/api/v1/events/evt"]]'::jsonb,
                           convert_to('{"id":"evt_00' || lpad(g::text, 24, '0') || '","type":"invoice.paid"}', 'UTF8'),
                           false, now(), now() + interval '1 day'
                      FROM generate_series(1, %(events)s) g""", {"credential": credential.pk, "events": events})
                cursor.execute("VACUUM ANALYZE intake_idempotencykey")
                cursor.execute("""SELECT (SELECT count(*) FROM webhooks_delivery d WHERE d.tenant_id = %(tenant)s),
                                         (SELECT count(*) FROM webhooks_deliveryattempt a JOIN webhooks_delivery d
                                            ON d.id = a.delivery_id WHERE d.tenant_id = %(tenant)s),
                                         (SELECT count(*) FROM webhooks_deliveryoutbox o JOIN webhooks_delivery d
                                            ON d.id = o.delivery_id WHERE d.tenant_id = %(tenant)s)""",
                               {"tenant": tenant.pk})
                deliveries, attempts, outbox = cursor.fetchone()
                cursor.execute("CHECKPOINT")
            seeds.append(seeded + time.monotonic() - started)
            tenant_delete(tenant=tenant)
            # as beat finds it once the grace (a lease's length) is over
            Tenant.objects.filter(pk=tenant.pk).update(deleted_at=timezone.now() - erasure_grace()
                                                       - timedelta(seconds=1))
            def without():
                rounds["without"].append(wrk(self.web.url + "/api/v1/events", mode="first", token=self.token,
                                             path="/api/v1/events", connections=16, seconds=self.seconds))

            # alternating: the run without the erasure comes before it in even rounds, after it in odd ones, so
            # that what drifts (the database growing, the machine) falls on both sides alike
            if n % 2 == 0:
                without()
            result: dict = {}

            def erase():
                started = time.monotonic()
                try:
                    result["erased"] = tenants_erase(max_seconds=3600)
                finally:
                    result["seconds"] = time.monotonic() - started
                    connection.close()

            eraser = threading.Thread(target=erase)
            eraser.start()
            time.sleep(1)
            rounds["during"].append(wrk(self.web.url + "/api/v1/events", mode="first", token=self.token,
                                        path="/api/v1/events", connections=16, seconds=self.seconds))
            eraser.join()
            if "erased" not in result:
                raise RuntimeError("the erasure failed (see its traceback above)")
            if n % 2 == 1:
                without()
            erased, seconds = result["erased"], result["seconds"]
            gone = not Tenant.objects.filter(pk=tenant.pk).exists()
            erasures.append({"rows": erased.rows, "events": erased.events, "deliveries": erased.deliveries,
                             "other": erased.other, "seconds": seconds, "rows_per_second": erased.rows / seconds,
                             "seeded_deliveries": deliveries, "seeded_attempts": attempts, "seeded_outbox": outbox,
                             "tenant_gone": gone, "during_outlasted_wrk": seconds > self.seconds + 1})
            print(f"erasure round {n + 1}: {erased.rows:,} rows ({erased.events:,} events, {erased.deliveries:,} "
                  f"deliveries, {erased.other:,} attempts, outbox rows, keys, endpoints, ...) in {seconds:.1f} s = "
                  f"{erased.rows / seconds:,.0f} rows/s, tenant gone: {gone}; intake p99 "
                  f"{rounds['without'][-1]['p99_ms']:.1f} ms without, {rounds['during'][-1]['p99_ms']:.1f} ms during",
                  flush=True)
            self.cancel_backlog()
        out = {name: {"rps": statistics.median(r["rps"] for r in results),
                      "p99_ms": statistics.median(r["p99_ms"] for r in results),
                      "rounds_rps": [round(r["rps"]) for r in results],
                      "rounds_p99_ms": [round(r["p99_ms"], 1) for r in results],
                      "errors": sum(r["errors"] + r["non2xx"] for r in results)} for name, results in rounds.items()}
        rate = statistics.median(e["rows_per_second"] for e in erasures)
        self.results["erasure"] = {
            "events": events, "pause_ratio": settings.EVENT_RETENTION_PAUSE_RATIO, "batch": settings.EVENT_RETENTION_BATCH,
            "seed_seconds": statistics.median(seeds), "rounds": erasures, "rows_per_second": rate,
            "rounds_rows_per_second": [round(e["rows_per_second"]) for e in erasures],
            "all_gone": all(e["tenant_gone"] for e in erasures), "intake": out,
            "p99_ratio": out["during"]["p99_ms"] / out["without"]["p99_ms"],
        }
        e = self.results["erasure"]
        print(f"erasure: {rate:,.0f} rows/s (median of {e['rounds_rows_per_second']}); intake p99 "
              f"{out['without']['p99_ms']:.1f} ms without {out['without']['rounds_p99_ms']}, "
              f"{out['during']['p99_ms']:.1f} ms during {out['during']['rounds_p99_ms']}: {e['p99_ratio']:.2f}x",
              flush=True)

    @staticmethod
    def _db_now():
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            return cursor.fetchone()[0]

    def longpoll(self):
        """Polling endpoints (SPEC §12). (1) Intake at c=16 with and without 200 idle long-polls waiting
        (wait=30, on endpoints of another tenant that the events do not match), alternating rounds: the
        waits are parked in gunicorn's event loop and must cost intake nothing. (2) How fast a waiting
        poll wakes (LISTEN/NOTIFY) after the POST that makes its message is answered. (3) What the
        alternative, a poll loop, would cost: one empty read's time, times the re-reads 200 pollers make."""
        import socket

        import requests
        from intake.credentials import credential_create
        from webhooks.services.endpoints import endpoint_create

        credential, token = credential_create(tenant_name=f"pollers-{uuid.uuid4().hex[:6]}")
        idle = [endpoint_create(tenant=credential.tenant, kind="poll", event_types=["idle.never"], channels=[]).id
                for _ in range(20)]
        host, port = self.web.url.removeprefix("http://").split(":")

        def open_pollers(count: int) -> list[socket.socket]:
            socks = []
            for n in range(count):
                sock = socket.create_connection((host, int(port)))
                sock.sendall(f"GET /api/v1/endpoints/{idle[n % len(idle)]}/messages?wait=30 HTTP/1.1\r\n"
                             f"Host: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
                socks.append(sock)
            time.sleep(1.0)
            for sock in socks:  # none may have been answered: they wait
                sock.setblocking(False)
                try:
                    assert not sock.recv(1, socket.MSG_PEEK), "an idle long-poll was answered"
                except BlockingIOError:
                    pass
            return socks

        rounds: dict[str, list[dict]] = {"without": [], "with_200_waiting": []}
        for round_ in range(self.rounds):
            for name in abba(round_, rounds):
                socks = open_pollers(self.size(200, 200, 20)) if name != "without" else []
                rounds[name].append(wrk(self.web.url + "/api/v1/events", mode="first", token=self.token,
                                        path="/api/v1/events", connections=16, seconds=self.seconds))
                for sock in socks:
                    sock.close()
                self.purge_queue()
        out: dict = {}
        for name, results in rounds.items():
            out[name] = {"rps": statistics.median(r["rps"] for r in results),
                         "p99_ms": statistics.median(r["p99_ms"] for r in results),
                         "rounds_rps": [round(r["rps"]) for r in results],
                         "rounds_p99_ms": [round(r["p99_ms"], 1) for r in results],
                         "errors": sum(r["errors"] + r["non2xx"] for r in results)}
            print(f"longpoll intake {name:17} {out[name]['rps']:7.0f} req/s p99 {out[name]['p99_ms']:6.1f} ms "
                  f"rounds {out[name]['rounds_rps']} p99s {out[name]['rounds_p99_ms']}", flush=True)
        self.cancel_backlog()

        # (2) wake latency: a poll waits, an event for its endpoint is posted; from the 202 to the answer
        woken = endpoint_create(tenant=credential.tenant, kind="poll", event_types=["wake.test"], channels=[]).id
        auth = {"Authorization": f"Bearer {token}"}
        latencies, cursor = [], "0"
        for n in range(self.size(30, 30, 3)):
            box: dict = {}

            def poll():
                answer = requests.get(f"{self.web.url}/api/v1/endpoints/{woken}/messages", headers=auth,
                                      params={"after": cursor, "wait": 20}, timeout=40)
                box["at"] = time.perf_counter()
                box["page"] = answer.json()

            thread = threading.Thread(target=poll)
            thread.start()
            time.sleep(0.3)
            requests.post(f"{self.web.url}/api/v1/events", json={"type": "wake.test", "data": {"n": n}},
                          headers={**auth, "Idempotency-Key": uuid.uuid4().hex}, timeout=10).raise_for_status()
            posted = time.perf_counter()
            thread.join(30)
            assert len(box["page"]["data"]) == 1, box
            cursor = box["page"]["next_cursor"]
            latencies.append((box["at"] - posted) * 1000)
        out["wake_ms"] = {"p50": round(statistics.median(latencies), 1), "max": round(max(latencies), 1)}

        # (3) a poll loop instead: the time of one empty read (wait=0), served by the same web process
        session = requests.Session()
        session.headers.update(auth)
        url = f"{self.web.url}/api/v1/endpoints/{idle[0]}/messages"
        for _ in range(20):
            session.get(url, timeout=10)
        started = time.perf_counter()
        reads = self.size(300, 300, 20)
        for _ in range(reads):
            session.get(url, timeout=10).raise_for_status()
        empty_ms = (time.perf_counter() - started) / reads * 1000
        out["empty_read_ms"] = round(empty_ms, 2)
        print(f"longpoll wake p50 {out['wake_ms']['p50']} ms max {out['wake_ms']['max']} ms; "
              f"one empty read {empty_ms:.2f} ms", flush=True)
        self.results["longpoll"] = out

    def memory(self):
        self.results["memory"] = {"web_peak_rss_mb": {str(k): round(v, 1) for k, v in self.web.peak_rss_mb().items()}}

    # --- tracing -----------------------------------------------------------------------------
    def tracing(self):
        """What traces cost (SPEC §12): the intake's first executions at c=16 and a delivery drain, with
        OTEL_EXPORTER_OTLP_ENDPOINT unset ("off") and set ("on", every span exported to a local sink
        that reads and drops it: bench/otlp_sink.py; "on 10%": one trace in ten recorded), alternating
        rounds, medians. With
        BENCH_TODAY_TREE (a checkout of the code before tracing, e.g. `git archive <ref> | tar -x -C DIR`)
        the intake is also measured as it was ("today"), on the same database and packages."""
        import requests
        from django.conf import settings

        sink = self.start(stack.otlp_sink(stack.free_port()))
        on = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url}
        # one trace in ten recorded (OpenTelemetry's own sampler; a caller's sampled flag still decides)
        sampled = {**on, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}
        targets = [("off", self.web.url),
                   ("on", self.start(stack.gunicorn(stack.free_port(), name="gunicorn-traced", **on)).url),
                   ("on 10%", self.start(stack.gunicorn(stack.free_port(), name="gunicorn-sampled", **sampled)).url)]
        today = os.environ.get("BENCH_TODAY_TREE")
        if today:
            targets.insert(0, ("today", self.start(stack.gunicorn(stack.free_port(), name="gunicorn-today",
                                                                  cwd=Path(today))).url))
        runs: dict[str, list[dict]] = {name: [] for name, _ in targets}
        for round_ in range(self.rounds):
            for name, base in abba(round_, targets):
                runs[name].append(wrk(base + "/api/v1/events", mode="first", token=self.token, path="/api/v1/events",
                                      connections=16, seconds=self.seconds))
                self.purge_queue()
        intake = {}
        for name, results in runs.items():
            median = sorted(results, key=lambda r: r["rps"])[len(results) // 2]
            intake[name] = {"rps": median["rps"], "p50_ms": median["p50_ms"],
                            "p99_ms": statistics.median(r["p99_ms"] for r in results),
                            "rounds_rps": [round(r["rps"]) for r in results], "errors": median["errors"],
                            "non2xx": median["non2xx"]}
            print(f"tracing intake first c=16 {name:5} {intake[name]['rps']:7.0f} req/s "
                  f"p50 {intake[name]['p50_ms']:.1f} "
                  f"ms p99 {intake[name]['p99_ms']:.1f} ms rounds {intake[name]['rounds_rps']}", flush=True)
        spans_bytes_intake = requests.get(f"{sink.url}/stats", timeout=5).json()
        self.cancel_backlog()

        count = self.size(1500, 400, 50)
        tenant, _ = self.tenant_with_endpoints("tracing", ["/fast"], max_in_flight=settings.WEBHOOK_WORKER_CONCURRENCY)
        drains: dict[str, list[dict]] = {"off": [], "on": [], "on 10%": []}
        for round_ in range(self.size(3, 1, 1)):
            for name, env in abba(round_, (("off", {}), ("on", on), ("on 10%", sampled))):
                self.make_deliveries(tenant, count)
                drains[name].append(self.drain(count, f"tracing-{name.replace(' ', '').replace('%', '')}", **env))
        delivery = {}
        for name, results in drains.items():
            median = sorted(results, key=lambda r: r["per_second"])[len(results) // 2]
            delivery[name] = {"per_second": median["per_second"], "worker_cpu_ms": median["worker_cpu_ms"],
                              "runs": [round(r["per_second"]) for r in results],
                              "runs_cpu_ms": [round(r["worker_cpu_ms"], 2) for r in results]}
            print(f"tracing delivery {name:3} {delivery[name]['per_second']:6.0f}/s worker CPU "
                  f"{delivery[name]['worker_cpu_ms']:.2f} ms/delivery runs {delivery[name]['runs']}", flush=True)
        sink_stats = requests.get(f"{sink.url}/stats", timeout=5).json()
        self.results["tracing"] = {
            "intake_first_c16": intake, "delivery": delivery,
            "intake_on_vs_off": intake["on"]["rps"] / intake["off"]["rps"],
            **({"intake_off_vs_today": intake["off"]["rps"] / intake["today"]["rps"]} if today else {}),
            "delivery_on_vs_off": delivery["on"]["per_second"] / delivery["off"]["per_second"],
            "intake_sampled_vs_off": intake["on 10%"]["rps"] / intake["off"]["rps"],
            "delivery_sampled_vs_off": delivery["on 10%"]["per_second"] / delivery["off"]["per_second"],
            "exported": {"intake": spans_bytes_intake, "total": sink_stats}}
        t = self.results["tracing"]
        print(f"tracing: intake on/off {t['intake_on_vs_off']:.2f} (10% sampled {t['intake_sampled_vs_off']:.2f}), "
              f"delivery on/off {t['delivery_on_vs_off']:.2f} (10% sampled {t['delivery_sampled_vs_off']:.2f}); "
              f"exported {sink_stats}", flush=True)

    # --- sustained load, end to end -------------------------------------------------------------
    def sustained(self):
        """Issue 23 item 4 and issue 35 item 3: events offered at a fixed rate (open loop, 64 client threads:
        bench/openloop.py) for `--sustained-seconds` (30) each at 100, 200, 400 and 800/s, to Herald (one endpoint,
        the default cap of 10 in flight, as `demo_setup` makes it; `--sustained-cap` sets another) and to the plain
        sender (bench/floor.py's PlainSenderView: the key bookkeeping and one Celery task per event enqueued on
        commit), both to the fast local receiver, in ABBA order rate by rate, on one stack as `scripts/up` runs
        it (the Procfile: gunicorn
        with `--access-logfile -`, one `celery -A config worker`, beat, every log at INFO in JSON; gunicorn serves
        bench.wsgi, which hands /api/v1/ to Herald's application and /floor/ to the same handler). Per rate and
        side: offered, accepted (202), delivered (each accepted event's first arrival, after a grace period),
        post-to-arrival latency counted from the instant each POST was due, where the time went (due → 202, and
        for Herald 202 → the attempt's start in the worker, the attempt), the CPU each process used, what
        PostgreSQL's busy backends ran (stack.ActivitySampler); and each side's highest rate at which every
        event arrived with p99 ≤ 1 s."""
        from bench.openloop import offer

        tenant, token = self.tenant_with_endpoints("sustained", ["/sustained"], max_in_flight=self.sustained_cap)
        verbose = {"LOG_LEVEL": "INFO", "HERALD_LOG_LEVEL": "INFO", "HERALD_LOG_FORMAT": "json"}
        web = self.start(stack.gunicorn(stack.free_port(), app="bench.wsgi", name="gunicorn-up",
                                        args=("--access-logfile", "-"), BENCH_FLOOR_CREDENTIAL_ID=self.floor_credential.id,
                                        BENCH_SENDER_RECEIVER_URL=f"{self.receiver.url}/plain", **verbose))
        procs = {"web": web, "worker": self.start(stack.worker("sustained", **verbose)),
                 "beat": self.start(stack.beat(**verbose)), "receiver": self.receiver}
        urls = {"herald": f"{web.url}/api/v1/events", "plain": f"{web.url}/floor/send"}
        # warm: every gunicorn thread and the worker's engine and relay have done one of each, on both sides
        for url in urls.values():
            offer(url, token, rate=50, seconds=1, run=f"warm-{uuid.uuid4().hex[:6]}")
        self.wait_for_arrivals(100, limit=30, poll=0.2)
        self.cancel_backlog()
        rows: dict[str, list[dict]] = {"herald": [], "plain": []}
        try:
            for index, rate in enumerate(self.sustained_rates):
                for side in abba(index, ("herald", "plain")):
                    rows[side].append(self._sustained_rate(side, urls[side], token, rate, procs))
                    self.cancel_backlog()
                    self.purge_queue()  # a plain task that never arrived must not land in the next side's count
        finally:
            for name in ("beat", "worker", "web"):
                procs[name].stop()

        def highest(side_rows):
            return max((r["rate"] for r in side_rows if r["all_delivered"] and r["p99_ms"] <= 1000), default=0)

        held, plain_held = highest(rows["herald"]), highest(rows["plain"])
        self.results["sustained"] = {"rows": rows["herald"], "plain_rows": rows["plain"], "highest_rate": held,
                                     "plain_highest_rate": plain_held, "threads": 64, "endpoint_cap": self.sustained_cap,
                                     "order": "abba"}
        print(f"sustained: highest rate with every event delivered and p99 <= 1 s: Herald {held}/s, "
              f"the plain sender {plain_held}/s", flush=True)

    def _sustained_rate(self, side: str, url: str, token: str, rate: int, procs: dict) -> dict:
        """One side's offering at `rate` (see sustained()): its row, printed."""
        from django.db import connection

        from bench.openloop import offer

        self.reset_receiver()
        cpu_before = {name: proc.cpu_seconds() for name, proc in procs.items()}
        busy_before = machine_busy()
        by_command_before, own_before = cpu_by_command(), sum(os.times()[:2])
        profilers = (self.profile(f"{side}-{rate}", web=procs["web"], worker=procs["worker"])
                     if self.sustained_profile else [])
        started = time.time()
        # PostgreSQL's side: what its busy backends ran, sampled every 20 ms through the offering
        with stack.ActivitySampler() as activity:
            sent = offer(url, token, rate=rate, seconds=self.sustained_seconds, run=f"{side}{rate}-{uuid.uuid4().hex[:8]}")
        offered_until = time.time()
        for profiler in profilers:
            profiler.wait(60)
        span = offered_until - started
        cpu = {name: round((proc.cpu_seconds() - cpu_before[name]) / span, 2) for name, proc in procs.items()}
        busy = machine_busy(busy_before)
        # the rest of the machine (PostgreSQL, Redis, this load generator, whatever else runs), in cores
        others = {command: round(seconds / span, 2) for command, seconds in cpu_by_command(by_command_before).items()}
        others["load generator"] = round((sum(os.times()[:2]) - own_before) / span, 2)
        others = dict(sorted(((k, v) for k, v in others.items() if v >= 0.01), key=lambda kv: -kv[1])[:8])
        accepted = [s for s in sent if s.status == 202]
        # grace: until every accepted event has arrived, or nothing arrived for 20 s (at most 10 minutes)
        self.wait_for_arrivals(len(accepted), limit=600, poll=0.5)
        stats = self.receiver_stats()
        received = stats["received"]
        delivered = [s for s in accepted if s.event_id in received]
        latency = [(received[s.event_id] - s.due) * 1000 for s in delivered]
        intake = [(s.answered - s.due) * 1000 for s in accepted]
        late = [(s.sent - s.due) * 1000 for s in sent]
        to_attempt: list[float] = []
        attempt: list[float] = []
        if side == "herald":  # where the time went: the attempt's start (the worker's clock) per delivered event
            with connection.cursor() as cursor:
                cursor.execute("SELECT d.event_id, extract(epoch FROM min(a.started_at)) FROM webhooks_delivery d "
                               "JOIN webhooks_deliveryattempt a ON a.delivery_id = d.id "
                               "WHERE d.event_id = ANY(%s) GROUP BY d.event_id", [[s.event_id for s in delivered]])
                attempt_at = dict(cursor.fetchall())
            to_attempt = [(float(attempt_at[s.event_id]) - s.answered) * 1000 for s in delivered if s.event_id in attempt_at]
            attempt = [(received[s.event_id] - float(attempt_at[s.event_id])) * 1000 for s in delivered
                       if s.event_id in attempt_at]
        arrivals = sorted(received[s.event_id] for s in delivered)
        first_due = sent[0].due
        # the latency through the run: per second of due time, events, p50 and max post-to-arrival (ms)
        seconds: dict[int, list[float]] = {}
        for s, ms in zip(delivered, latency):
            seconds.setdefault(int(s.due - first_due), []).append(ms)
        timeline = [[second, len(values), round(percentile(values, 50)), round(max(values))]
                    for second, values in sorted(seconds.items())]
        row = {
            "rate": rate, "seconds": self.sustained_seconds, "offered": len(sent), "accepted": len(accepted),
            "refused": {str(status): sum(1 for s in sent if s.status == status)
                        for status in {s.status for s in sent if s.status != 202}},
            "delivered": len(delivered), "all_delivered": len(delivered) == len(sent),
            "duplicates": stats["count"] - len(received),
            "accepted_per_second": len(accepted) / (max(s.answered for s in sent) - first_due),
            "delivered_per_second": len(delivered) / (arrivals[-1] - first_due) if arrivals else 0.0,
            "drain_seconds": (arrivals[-1] - sent[-1].due) if arrivals else float("nan"),
            "p50_ms": percentile(latency, 50), "p99_ms": percentile(latency, 99),
            "max_ms": max(latency, default=float("nan")),
            "intake_p50_ms": percentile(intake, 50), "intake_p99_ms": percentile(intake, 99),
            "send_late_p99_ms": percentile(late, 99),
            "to_attempt_p50_ms": percentile(to_attempt, 50), "to_attempt_p99_ms": percentile(to_attempt, 99),
            "attempt_p50_ms": percentile(attempt, 50), "attempt_p99_ms": percentile(attempt, 99),
            "cpu_cores": cpu, "cpu_cores_by_command": others, "machine_busy": busy, "timeline": timeline,
            "postgres_active": activity.top(6),
        }
        print(f"sustained {side:6} {rate:4}/s x {self.sustained_seconds:g}s: offered {row['offered']} accepted "
              f"{row['accepted']} delivered {row['delivered']} (dup {row['duplicates']}); post->arrival p50 "
              f"{row['p50_ms']:.0f} p99 {row['p99_ms']:.0f} max {row['max_ms']:.0f} ms; due->202 p50 "
              f"{row['intake_p50_ms']:.0f} p99 {row['intake_p99_ms']:.0f}; 202->attempt p50 "
              f"{row['to_attempt_p50_ms']:.0f} p99 {row['to_attempt_p99_ms']:.0f}; attempt p99 "
              f"{row['attempt_p99_ms']:.0f} ms; accepted {row['accepted_per_second']:.0f}/s delivered "
              f"{row['delivered_per_second']:.0f}/s; cores {cpu} busy {busy:.2f}; by command {others}; PostgreSQL's "
              f"backends at once, by statement: {row['postgres_active']}", flush=True)
        return row

    def profile_into(self, label: str, seconds: float, wall: bool = False, **procs) -> list[subprocess.Popen]:
        """py-spy record --gil (samples of the thread holding the GIL: where the process's Python CPU goes) of each
        process group in `procs` for `seconds`, into `--profile`'s directory as <name>-<label>.txt (collapsed).
        `wall`: every thread instead, running or waiting, named (--idle --threads): where each thread's time goes."""
        directory = Path(self.profile_dir)
        directory.mkdir(parents=True, exist_ok=True)
        which = ["--idle", "--threads"] if wall else ["--gil"]
        return [subprocess.Popen([str(stack.BIN / "py-spy"), "record", "--pid", str(proc.pgid), "--subprocesses", *which,
                                  "--rate", "100" if wall else "250", "--duration", str(max(1, round(seconds))), "--format", "raw",
                                  "--nonblocking", "--output", str(directory / f"{name}-{label}.txt")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for name, proc in procs.items()]

    def profile(self, label: str, **procs) -> list[subprocess.Popen]:
        """py-spy record (on-CPU samples, collapsed stacks) of each process group in `procs` for one offering
        (`label`: the side and the rate), into `--sustained-profile`'s directory as <name>-<label>.txt."""
        directory = Path(self.sustained_profile)
        directory.mkdir(parents=True, exist_ok=True)
        return [subprocess.Popen([str(stack.BIN / "py-spy"), "record", "--pid", str(proc.pgid), "--subprocesses",
                                  "--rate", "50", "--duration", str(round(self.sustained_seconds)), "--format", "raw",
                                  "--nonblocking", "--output", str(directory / f"{name}-{label}.txt")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for name, proc in procs.items()]

    def run(self, only: set[str] | None):
        # every part is stamped with the commit it ran on, whether the tree differed from it, when and how
        code = code_stamp()
        stamps = self.results.setdefault("stamps", {})
        try:
            self.setup()
            from config.startup import autovacuum_setting

            for name in PARTS:
                if only and name not in only and not (name == "end_to_end" and "delivery" in only):
                    continue
                started = time.time()
                getattr(self, name)()
                stamps[name] = {**code, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                                "seconds": round(time.time() - started, 1), "quick": self.quick,
                                "smoke": self.smoke, "rounds": self.rounds,
                                # the bench VACUUMs what it churns between measurements, but within one, dead
                                # rows pile up where autovacuum is off
                                "postgres_autovacuum": autovacuum_setting()}
                print(f"({name}: {stamps[name]['seconds']:g} s)", flush=True)
        finally:
            for proc in reversed(self.procs):
                proc.stop()
        out = self.out
        out.mkdir(parents=True, exist_ok=True)
        results = self.results
        if only and (out / "results.json").exists():
            # a partial run replaces its sections of the last results; each section keeps its own stamp
            previous = json.loads((out / "results.json").read_text())
            sections = {k: v for k, v in self.results.items()
                        if k not in ("machine", "quick", "smoke", "started", "stamps")}
            results = {**previous, **sections, "stamps": {**previous.get("stamps", {}), **stamps}}
        (out / "results.json").write_text(json.dumps(results, indent=2))
        self.results = results
        if self.fairness_parts:  # a partial section: its figures are printed above and kept in results.json only
            print(f"wrote {out / 'results.json'}")
            return
        from bench.report import write_report

        write_report(self.results, out)
        print(f"wrote {out / 'results.json'}, results.md and results.png")


def code_stamp() -> dict:
    """The commit the bench runs on, and whether the tree differs from it (results and Markdown aside)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=stack.ROOT, capture_output=True, text=True, check=False).stdout.strip()

    changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no", "--", ".",
                                        ":!bench/results", ":!*.md").splitlines()]
    return {"commit": git("rev-parse", "--short=12", "HEAD") or None, "dirty": bool(changed),
            "dirty_files": changed[:20]}


class SqlTimer:
    """A Django execute_wrapper that adds each statement's round trip, in seconds, to `spent`."""

    def __init__(self) -> None:
        self.spent: list[float] = []

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.spent.append(time.perf_counter() - started)

    @classmethod
    def db_ms(cls, action, runs=5) -> float:
        """The median database time of `action` over `runs` (after one warm-up), in milliseconds."""
        from django.db import connection

        timed = cls()
        action()
        times = []
        for _ in range(runs):
            timed.spent.clear()
            with connection.execute_wrapper(timed):
                action()
            times.append(sum(timed.spent) * 1000)
        return statistics.median(times)


def machine_busy(before: tuple[int, int] | None = None):
    """The machine's CPU counters from /proc/stat (busy, total jiffies); with `before`, the busy fraction since."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    now = (sum(fields) - fields[3] - fields[4], sum(fields))  # idle and iowait are not busy
    if before is None:
        return now
    return round((now[0] - before[0]) / max(1, now[1] - before[1]), 3)


def cpu_by_command(before: dict | None = None) -> dict:
    """CPU seconds (user + system) of every live process of the machine, by pid: {pid: (command, seconds)};
    with `before` (an earlier answer), the seconds used since, summed per command name."""
    tick = os.sysconf("SC_CLK_TCK")
    now: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        now[int(entry)] = (stat[stat.index("(") + 1:stat.rindex(")")], (int(fields[11]) + int(fields[12])) / tick)
    if before is None:
        return now
    totals: dict[str, float] = {}
    for pid, (command, seconds) in now.items():
        command = command.split("/")[0]  # kworker/u8:2-… and the like, as one
        totals[command] = totals.get(command, 0.0) + seconds - before.get(pid, (command, 0.0))[1]
    return totals


# About how long each part takes with --smoke on the 2-core box, to balance the shards (seconds).
SMOKE_SECONDS = {"intake": 9, "batch": 20, "outbox": 4, "catalog": 6, "filters": 1, "delivery": 42, "destinations": 20,
                 "access": 17, "slow_receivers": 19, "scaling": 33, "brokers": 21, "noisy_neighbour": 8, "fairness": 69,
                 "ordering": 31, "throttle": 15, "pools": 32, "fan_out": 34, "cost": 33, "prune": 7, "dispatch": 10,
                 "year": 11, "erasure": 5, "scrape": 2, "longpoll": 7, "memory": 0, "tracing": 39, "sustained": 43}


def smoke_plan(shards: int) -> list[list[str]]:
    """The parts (every one but end_to_end, which runs with delivery) over `shards` lists: longest first, each to
    the list with the least time so far."""
    loads: list[list] = [[0.0, []] for _ in range(shards)]
    for part in sorted((p for p in PARTS if p != "end_to_end"), key=lambda p: -SMOKE_SECONDS.get(p, 10)):
        shard = min(loads, key=lambda load: load[0])
        shard[0] += SMOKE_SECONDS.get(part, 10)
        shard[1].append(part)
    return [parts for _, parts in loads if parts]


def smoke_in_shards(shards: int) -> int:
    """`--smoke`: every part, split over `shards` bench processes run at once (longest parts first, each to the
    shard with the least so far), each on its own database, queue and log directory; 0 when every shard passed."""
    import tempfile

    logs = Path(tempfile.mkdtemp(prefix="herald-bench-smoke-"))
    started = time.monotonic()
    running = []
    for n, parts in enumerate(smoke_plan(shards)):
        env = {**os.environ, "BENCH_DB_NAME": f"{stack.DB_NAME}_smoke{n}", "BENCH_QUEUE": f"herald-bench-smoke{n}",
               "BENCH_LOG_DIR": str(stack.LOGS / f"smoke{n}")}
        log = open(logs / f"shard{n}.log", "w")  # noqa: SIM115 - closed below
        running.append((n, parts, log, subprocess.Popen(
            [sys.executable, "-m", "bench", "--smoke", "--only", ",".join(parts)], cwd=stack.ROOT, env=env,
            stdout=log, stderr=subprocess.STDOUT)))
    failed = []
    for n, parts, log, proc in running:
        code = proc.wait()
        log.close()
        print(f"bench --smoke shard {n} ({', '.join(parts)}): {'passed' if code == 0 else f'FAILED ({code})'}",
              flush=True)
        if code != 0:
            failed.append(n)
            print((logs / f"shard{n}.log").read_text()[-6000:], flush=True)
    print(f"bench --smoke: {shards} shards in {time.monotonic() - started:.0f} s; their output in {logs}", flush=True)
    return 1 if failed else 0


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    pg = subprocess.run(["psql", "-h", "127.0.0.1", "-d", "postgres", "-Atc", "show server_version"],
                        capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(int(mem) / 1024 / 1024, 1),
            "python": platform.python_version(), "postgres": pg, "kernel": platform.release()}


def main():
    import shutil

    if shutil.which("wrk") is None:
        raise SystemExit("bench: wrk drives the intake load; install it first: sudo apt-get install wrk")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter runs (about two minutes)")
    parser.add_argument("--smoke", action="store_true",
                        help="every part, tiny, one round, into a temporary directory (never bench/results/) and a "
                             "database and queue of its own: to see that the bench runs, not to measure")
    parser.add_argument("--smoke-shards", type=int, default=4,
                        help="--smoke without --only: the parts split over this many bench processes at once, each "
                             "with its own database, queue and logs (default 4; most of a smoke is waiting on "
                             "processes to start)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds of the intake's c=16 first and replay runs (medians; default 5)")
    parser.add_argument("--only", help="comma-separated: " + ",".join(PARTS))
    parser.add_argument("--profile", metavar="DIR",
                        help="record py-spy profiles (--gil) of gunicorn during an extra round of `intake` (first "
                             "executions, c=16) and of gunicorn and the worker during an extra offering of `batch`, "
                             "into DIR (not the measured rounds: py-spy costs CPU)")
    parser.add_argument("--sustained-seconds", type=float,
                        help="how long `sustained` offers each rate (default 30; 10 with --quick)")
    parser.add_argument("--sustained-rates", default="100,200,400,800",
                        help="the events/s `sustained` offers, in order (default 100,200,400,800)")
    parser.add_argument("--sustained-cap", type=int, default=10,
                        help="the endpoint's cap of attempts in flight in `sustained` (default 10, the default cap)")
    parser.add_argument("--sustained-profile", metavar="DIR",
                        help="record a py-spy profile of gunicorn and the worker during each rate of `sustained` into DIR "
                             "(it costs CPU: not for the measured runs)")
    parser.add_argument("--fairness-parts", metavar="NAMES",
                        help="comma-separated figures of `fairness` to run (quiet_behind_backlog, many_loud, "
                             "retrying_loud, weights, alone, scheduler_cost): to try a change; needs --out, since "
                             "a section with some figures missing is not one to publish")
    parser.add_argument("--out", metavar="DIR", help="write results.json and the report into DIR, not bench/results/")
    args = parser.parse_args()
    if args.fairness_parts and not (args.out or args.smoke):
        raise SystemExit("bench: --fairness-parts writes a partial fairness section: give --out DIR")
    if args.smoke and not args.only and args.smoke_shards > 1 and not os.environ.get("BENCH_SMOKE"):
        raise SystemExit(smoke_in_shards(args.smoke_shards))
    out = RESULTS
    if args.smoke:
        import tempfile

        stack.DB_NAME = os.environ.setdefault("BENCH_DB_NAME", "herald_bench_smoke")
        os.environ["BENCH_SMOKE"] = "1"  # bench/stack.py: workers start without mingle
        os.environ.setdefault("BENCH_QUEUE", "herald-bench-smoke")
        out = Path(tempfile.mkdtemp(prefix="herald-bench-smoke-"))
    if args.out:
        out = Path(args.out)
    only = set(args.only.split(",")) if args.only else None
    bench = Bench(args.quick, args.rounds, args.sustained_seconds, tuple(int(r) for r in args.sustained_rates.split(",")),
                  args.sustained_profile, smoke=args.smoke, out=out)
    bench.sustained_cap = args.sustained_cap
    bench.profile_dir = args.profile
    bench.fairness_parts = set(args.fairness_parts.split(",")) if args.fairness_parts else set()
    started = time.monotonic()
    bench.run(only)
    if args.smoke:
        missing = [name for name in PARTS if (not only or name in only) and name not in bench.results]
        if missing:
            raise SystemExit(f"bench --smoke: no section written by {', '.join(missing)}")
        print(f"bench --smoke: every part ran ({time.monotonic() - started:.0f} s), results in {out}")


if __name__ == "__main__":
    main()
