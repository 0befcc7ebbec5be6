"""The scenarios: each drives Herald from outside over HTTP, injects its fault, and returns one report row."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import psycopg

from blackbox import checks, frontdoor, fuzz, slowclients, tenant_walls
from blackbox.checks import Db
from blackbox.client import Api, Reply
from blackbox.failover import Formation
from blackbox.hosts import HostsStack, Network, address, wait_serving
from blackbox.receivers import AlwaysOk, Flapping, Gone, Hang, Receiver, Receivers, Slow, Switch
from blackbox.stack import (HERALD_ENV, INTAKE_MAX_BODY_BYTES, LOGS, RETRY_SCHEDULE, ROOT, TIMEOUT_SECONDS, VENV_BIN,
                            Stack, socket_owners, wait_until)

EVENTS = "/api/v1/events"
JITTER = 0.1
RECOVERY_LIMIT = 2 * TIMEOUT_SECONDS + 30  # SPEC §6: a dead worker's delivery is sent again within this


@dataclass(frozen=True)
class Profile:
    name: str
    storm_events: int
    storm_clients: int
    kill_events: int
    broker_events: int
    db_events: int
    db_clients: int
    flap_events: int
    fuzz_examples: int
    fuzz_seconds: float
    soak_seconds: float
    soak_rate: float
    rss_limit_mb: float
    settle_seconds: float
    hang_events: int = 60
    neighbour_seconds: float = 10
    breaker_events: int = 30
    # old events seeded for the year scenario, four deliveries and attempts each: in the short profile (CI) 100,000,
    # 900,000 rows seeded in 23 s where 250,000 took 67 s (the prune's minute is its 53 partitions, not its rows)
    year_events: int = 100_000
    year_seconds: float = 15  # intake load before, and again during, the prune
    slow_seconds: float = 25  # normal requests under the slowloris siege
    rate_seconds: float = 10  # one credential at 3x INTAKE_RATE_LIMIT_PER_SECOND, another below it
    door_seconds: float = 15  # normal requests beside the front door's framing attacks
    failover_seconds: float = 40  # steady intake across a PostgreSQL failover (the primary killed after a quarter)
    failover_rate: float = 15  # events/s offered meanwhile
    hosts_events: int = 150  # posted over two API hosts while a worker host is cut off; as many with the broker cut
    fair_events: int = 300  # the loud tenant's burst in the fairness scenario, each fanned out to fair_fanout endpoints
    fair_fanout: int = 10
    fair_seconds: float = 20  # the quiet tenant posts at most this long while the loud one's burst is worked off


PROFILES = {
    "short": Profile("short", storm_events=300, storm_clients=40, kill_events=400, broker_events=90, db_events=120,
                     db_clients=8, flap_events=45, fuzz_examples=300, fuzz_seconds=100, soak_seconds=30,
                     soak_rate=20, rss_limit_mb=150, settle_seconds=90),
    "full": Profile("full", storm_events=2000, storm_clients=200, kill_events=800, broker_events=400, db_events=600,
                    db_clients=20, flap_events=300, fuzz_examples=3000, fuzz_seconds=900, soak_seconds=300,
                    soak_rate=20, rss_limit_mb=300, settle_seconds=300, hang_events=200, neighbour_seconds=40,
                    breaker_events=100, year_events=1_250_000, year_seconds=40, slow_seconds=60, rate_seconds=30,
                    door_seconds=60, failover_seconds=90, failover_rate=30, hosts_events=600, fair_events=1000,
                    fair_fanout=20, fair_seconds=60),
}

SCENARIOS = ["storm", "storm-platform", "worker-kill", "broker-restart", "broker-flush", "db-restart", "flapping",
             "noisy-neighbour", "noisy-neighbour-platform", "breaker", "slow-clients", "front-door", "rate-limit", "scope",
             "fuzz", "soak", "year", "database-failover", "hosts", "poll-flood", "regex-attack",
             "fairness"]
ALIASES = {"broker": ["broker-restart", "broker-flush"], "kill": ["worker-kill"], "db": ["db-restart", "database-failover"],
           "flap": ["flapping"], "isolation": ["noisy-neighbour", "noisy-neighbour-platform", "breaker"],
           "abuse": ["slow-clients", "front-door", "rate-limit", "scope"], "platform": ["storm-platform", "noisy-neighbour-platform"],
           "walls": ["poll-flood", "regex-attack"]}
KILL_MIN_IN_FLIGHT = 200  # the worker-kill scenario SIGKILLs a worker holding at least this many attempts


@dataclass
class Result:
    """One row of the report."""

    scenario: str
    load: str = ""
    faults: str = "none"
    inputs: int = 0
    executed_twice: int = 0
    lost: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    seconds: float = 0.0
    crashed: bool = False

    @property
    def passed(self) -> bool:
        return not self.problems and not self.lost and not self.executed_twice and not self.crashed

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else ("ERROR" if self.crashed else "FAIL")

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def as_dict(self) -> dict:
        return checks.json_safe({
            "scenario": self.scenario, "load": self.load, "faults": self.faults, "inputs": self.inputs,
            "executed_twice": self.executed_twice, "lost": self.lost, "result": self.verdict,
            "seconds": round(self.seconds, 1), "problems": self.problems, "notes": self.notes,
            "details": self.details})


@dataclass
class Tenant:
    name: str
    api: Api
    token: str
    credential_id: int
    tenant_id: str


class Context:
    """What every scenario shares: the stack, the profile, the receivers and a read-only database handle."""

    def __init__(self, stack: Stack, profile: Profile, seed: int = 1):
        self.stack = stack
        self.profile = profile
        self.seed = seed
        self.rng = random.Random(seed)
        self.receivers = Receivers()
        self.db = Db(stack.pg.dsn)
        self.run_id = uuid.uuid4().hex[:8]
        self._canary: tuple[Tenant, Receiver] | None = None
        self._platform: tuple[str, int] | None = None

    def tenant(self, name: str, via_platform: bool = False) -> Tenant:
        """A tenant with a credential of its own (`manage.py create_credential --tenant`); or, `via_platform`,
        one created through the tenants API by the run's platform credential, which then acts for it under
        /api/v1/tenants/{uid}/ (SPEC §10)."""
        if via_platform:
            return self.platform_tenant(name)
        token = self.stack.create_credential(f"bb-{name}-{self.run_id}")
        credential_id, tenant_id = self.db.credential(token)
        return Tenant(name, Api(self.stack.base_url, token), token, credential_id, tenant_id)

    def platform_token(self) -> str:
        """The run's platform credential (`create_credential --platform`), made at its first use."""
        if self._platform is None:
            token = self.stack.manage("create_credential", "--platform").strip().splitlines()[-1].strip()
            self._platform = (token, self.db.credential(token)[0])
        return self._platform[0]

    def platform_tenant(self, name: str) -> Tenant:
        self.platform_token()
        token, credential_id = self._platform
        uid = f"bb-{name}-{self.run_id}"
        replies = Api(self.stack.base_url, token).post_retrying("/api/v1/tenants", {"name": name, "uid": uid},
                                                                f"tenant-{uid}", budget=60)
        if replies[-1].status != 201:
            raise RuntimeError(f"creating tenant {uid}: {replies[-1].short()} {replies[-1].body[:300]!r}")
        return Tenant(name, Api(self.stack.base_url, token, tenant=uid), token, credential_id, replies[-1].json()["id"])

    def endpoint(self, tenant: Tenant, receiver: Receiver, event_types: list[str], suffix: str | None = None,
                 **options) -> dict:
        """An endpoint at the receiver (at /hook/NAME, or /hook/NAME/SUFFIX), its secret given to the receiver."""
        if suffix is None:
            url, key = receiver.url, f"ep-{receiver.name}-{self.run_id}"
        else:
            path, url = receiver.path_url(suffix)
            key = f"ep-{receiver.name}-{suffix}-{self.run_id}"
        endpoint = tenant.api.create_endpoint(url, event_types, key=key, **options)
        if suffix is None:
            receiver.secret = endpoint["secret"]
        else:
            receiver.secrets[path] = endpoint["secret"]
        return endpoint

    def heal(self) -> list[str]:
        """Between scenarios: every Herald process alive and a canary event delivered, else restart them."""
        stack = self.stack
        notes = []
        dead = [name for name, proc in stack.procs.items() if not proc.alive()]
        if dead:
            notes.append(f"after this scenario {', '.join(dead)} had exited; the harness replaced "
                         f"{'them' if len(dead) > 1 else 'it'}")
        if any(not name.startswith("w") for name in dead):  # gunicorn or beat: start everything afresh
            stack.restart_herald(f"{dead} had exited")
            dead = []
        for name in dead:
            stack.procs.pop(name).stop()
        for _ in range(2 - len(stack.workers())):
            stack.start_worker()
        if self._canary is None:
            tenant = self.tenant("canary")
            receiver = self.receivers.new("canary", AlwaysOk())
            self.endpoint(tenant, receiver, ["canary.*"])
            self._canary = (tenant, receiver)
        tenant, receiver = self._canary
        key = f"canary-{uuid.uuid4().hex}"
        replies = tenant.api.post_retrying(EVENTS, event_body("canary", key, 0), key, budget=30)
        delivered = False
        if replies and replies[-1].status == 202:
            delivered = not receiver.wait_for_ids({replies[-1].json()["id"]}, timeout=30)
        if not delivered:
            notes.append("canary not delivered within 30 s after this scenario: every Herald process was restarted")
            stack.restart_herald(notes[-1])
        return notes

    def close(self) -> None:
        self.receivers.close()
        self.db.close()


def event_body(prefix: str, key: str, n: int) -> dict:
    return {"type": f"{prefix}.created", "data": {"key": key, "scenario": prefix, "n": n}}


# ---------------------------------------------------------------- shared machinery


class Load:
    """Posts events with the retrying client from a pool of client threads, in the background."""

    def __init__(self, api: Api, bodies: dict[str, dict], clients: int, budget: float, seed: int = 0):
        self.api = api
        self.bodies = bodies
        self.clients = clients
        self.budget = budget
        self.replies: dict[str, list[Reply]] = {}
        self.done = 0
        self._lock = threading.Lock()
        self._seed = seed
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def _job(self, key: str) -> None:
        rng = random.Random(f"{self._seed}-{key}")
        replies = self.api.post_retrying(EVENTS, self.bodies[key], key, budget=self.budget, rng=rng)
        with self._lock:
            self.replies[key] = replies
            self.done += 1

    def _run(self) -> None:
        with ThreadPoolExecutor(self.clients, thread_name_prefix="client") as pool:
            list(pool.map(self._job, list(self.bodies)))

    def start(self) -> Load:
        self._thread.start()
        return self

    def wait(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def all_replies(self) -> list[Reply]:
        with self._lock:
            return [reply for replies in self.replies.values() for reply in replies]


def check_intake(result: Result, ctx: Context, tenant: Tenant, replies_by_key: dict[str, list[Reply]],
                 keys: list[str]) -> set[str]:
    """Exactly one event per key, every 202 of a key the same, every answered event in the database.

    Returns the ids of every event Herald holds for the tenant (what must be delivered).
    """
    events_by_key = ctx.db.events_by_key(tenant.tenant_id)
    twice = checks.executed_twice(events_by_key)
    if twice:
        result.executed_twice += sum(twice.values())
        result.problem(f"{len(twice)} keys executed more than once, e.g. {sorted(twice)[:3]}")
    finals = {key: replies[-1] for key, replies in replies_by_key.items() if replies}
    first_202 = {}
    for key, replies in replies_by_key.items():
        ok = sorted((r for r in replies if r.status == 202), key=lambda r: r.sent)
        if ok:
            first_202[key] = ok[0]
    accepted = set(first_202)
    unanswered = set(keys) - accepted
    if unanswered:
        examples = [finals[k].short() if k in finals else "never sent" for k in sorted(unanswered)[:3]]
        result.problem(f"{len(unanswered)} keys never got a 202 within the client's budget: {examples}")
    missing = checks.missing_keys(accepted, events_by_key)
    if missing:
        result.lost += len(missing)
        result.problem(f"{len(missing)} keys answered 202 but have no event in the database")
    inconsistent = 0
    for key in accepted:
        bodies = {r.body for r in replies_by_key[key] if r.status == 202}
        if len(bodies) > 1:
            inconsistent += 1
    if inconsistent:
        result.problem(f"{inconsistent} keys got 202s with different bodies")
    db_ids = {event_id for ids in events_by_key.values() for event_id in ids}
    answered_ids = {first_202[key].json()["id"] for key in accepted}
    phantom = answered_ids - db_ids
    if phantom:
        result.lost += len(phantom)
        result.problem(f"{len(phantom)} event ids answered with 202 are not in the database")
    strays = set(events_by_key) - set(keys)
    if strays:
        result.problem(f"{len(strays)} events for keys nobody sent")
    return db_ids


def check_delivered(result: Result, ctx: Context, tenant: Tenant, receivers: list[Receiver], event_ids: set[str],
                    timeout: float, duplicates_allowed: bool,
                    fanout: list[tuple[Receiver, str, set[str]]] = ()) -> None:
    """Every event arrives (answered 2xx, signature verified) and is `succeeded` in the database.

    `event_ids` must arrive at one of `receivers`; each (receiver, path, ids) of `fanout` at that path too.
    """
    deadline = time.monotonic() + timeout
    missing = set(event_ids)
    fan_missing = [(receiver, path, set(ids)) for receiver, path, ids in fanout]
    while time.monotonic() < deadline:
        for receiver in receivers:
            missing -= receiver.succeeded_ids()
        for receiver, path, ids in fan_missing:
            ids -= receiver.succeeded_ids(path)
        if not missing and not any(ids for _, _, ids in fan_missing):
            break
        time.sleep(0.5)
    if missing:
        result.lost += len(missing)
        result.problem(f"{len(missing)} of {len(event_ids)} deliveries never arrived within {timeout:.0f}s")
    fan_lost = sum(len(ids) for _, _, ids in fan_missing)
    if fan_lost:
        result.lost += fan_lost
        result.problem(f"{fan_lost} fan-out deliveries never arrived within {timeout:.0f}s")
    not_done: dict = {}

    def db_settled():
        nonlocal not_done
        deliveries = ctx.db.deliveries(tenant.tenant_id)
        not_done = {d["id"]: d["status"] for d in deliveries.values()
                    if d["event_id"] in event_ids and d["status"] != "succeeded"}
        return not not_done

    try:
        wait_until(db_settled, 20, 0.5, "deliveries to be succeeded in the database")
    except TimeoutError:
        result.problem(f"{len(not_done)} deliveries not `succeeded` in the database: "
                       f"{checks.histogram(not_done.values())}")
    result.details["delivery_status"] = ctx.db.status_counts(tenant.tenant_id)
    check_receivers(result, receivers + [r for r, _, _ in fanout], duplicates_allowed)


def check_receivers(result: Result, receivers: list[Receiver], duplicates_allowed: bool) -> None:
    """Signatures verify, bodies are identical per webhook-id, and no webhook is ever sent twice at once."""
    receivers = list({id(r): r for r in receivers}.values())
    hits = [hit for receiver in receivers for hit in receiver.snapshot()]
    unverified = [h for h in hits if not h.verified]
    if unverified:
        result.problem(f"{len(unverified)} received webhooks failed verification: {unverified[0].verify_error}")
    by_id: dict[str, list] = defaultdict(list)  # one delivery: one endpoint (receiver path) and one webhook-id
    for receiver in receivers:
        for hit in receiver.snapshot():
            by_id[f"{receiver.name}{hit.path}#{hit.webhook_id}"].append(hit)
    body_problems = checks.body_problems(by_id)
    if body_problems:
        result.problem(f"{len(body_problems)} webhooks sent with differing bodies: {body_problems[:2]}")
    concurrent = {}
    for receiver in receivers:
        concurrent.update(receiver.concurrent_ids())
    if concurrent:
        result.executed_twice += len(concurrent)
        result.problem(f"{len(concurrent)} webhooks were being sent twice at the same moment")
    resent = {wid: n for wid, hs in by_id.items()
              if (n := sum(1 for h in hs if h.answered is not None and 200 <= h.answered < 300)) > 1}
    result.details["received"] = len(hits)
    result.details["redelivered_after_2xx"] = len(resent)
    if resent:
        if duplicates_allowed:
            result.notes.append(f"{len(resent)} webhooks arrived again after a 2xx (allowed: at-least-once)")
        else:
            result.executed_twice += len(resent)
            result.problem(f"{len(resent)} webhooks were sent again after the receiver answered 2xx")


def answer_summary(replies: list[Reply]) -> dict:
    return dict(Counter(("no answer" if r.status is None else str(r.status)) +
                        (f" {r.code}" if r.code else "") + (" replay" if r.replay else "") for r in replies))


def check_survivors(result: Result, stack: Stack, before: dict[str, list[int]], spared: tuple[str, ...] = ()) -> None:
    """Every Herald process running before the fault still runs: a fault must not take a process down."""
    for name, pids in before.items():
        if name in spared:
            continue
        proc = stack.procs.get(name)
        if proc is None or not proc.alive():
            reason = last_fatal_line(proc) if proc else "gone"
            result.problem(f"{name} (pid {pids[0] if pids else '?'}) exited during the fault: {reason}")
        elif proc.pids() != pids:
            result.notes.append(f"{name} changed child processes: {pids} → {proc.pids()}")


def last_fatal_line(proc) -> str:
    """The last CRITICAL (else ERROR) log message of a process, from its JSON log lines."""
    found = {"CRITICAL": "", "ERROR": ""}
    for line in proc.output().splitlines():
        if '"level": "CRITICAL"' in line or '"level": "ERROR"' in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            found[record.get("level", "ERROR")] = str(record.get("message", ""))[:160]
    return found["CRITICAL"] or found["ERROR"] or f"exit code {proc.popen.returncode}"


def _bodies(prefix: str, run_id: str, count: int) -> dict[str, dict]:
    keys = [f"{prefix}-{run_id}-{n:05d}" for n in range(count)]
    return {key: event_body(prefix, key, n) for n, key in enumerate(keys)}


# ---------------------------------------------------------------- 1. retry storm


def storm(ctx: Context, via_platform: bool = False) -> Result:
    """Clients retrying every request 1-5 times with its key, some racing the original: one event per key,
    every answer its first 202 (or 409 in progress), every delivery once. `via_platform`: the same through a
    platform credential acting for a tenant it created (storm-platform)."""
    profile = ctx.profile
    n, clients = profile.storm_events, profile.storm_clients
    fan_width = 11  # with the `storm.*` endpoint, 12 deliveries per fan-out event: more than are published inline
    name = "storm-platform" if via_platform else "storm"
    result = Result(name, load=f"{n} events (1 in 10 fanned out to 12), {clients} clients, 1-5 retries/key"
                               + (", platform credential" if via_platform else ""))
    tenant = ctx.tenant(name, via_platform=via_platform)
    receiver = ctx.receivers.new(name, AlwaysOk())
    ctx.endpoint(tenant, receiver, ["storm.*"])
    fan = ctx.receivers.new(f"{name}-fan", AlwaysOk())
    fan_paths = []
    for index in range(fan_width):
        ctx.endpoint(tenant, fan, ["storm.fanout"], suffix=str(index))
        fan_paths.append(fan.path_url(str(index))[0])
    bodies = _bodies("storm", f"{ctx.run_id}{'-p' if via_platform else ''}", n)
    for n_, key in enumerate(bodies):
        if n_ % 10 == 0:
            bodies[key]["type"] = "storm.fanout"
    keys = list(bodies)
    replies: dict[str, list[Reply]] = defaultdict(list)
    lock = threading.Lock()

    def send(key: str) -> None:
        reply = tenant.api.post(EVENTS, bodies[key], key)
        with lock:
            replies[key].append(reply)

    def client(my_keys: list[str], seed: int) -> None:
        rng = random.Random(seed)
        for key in my_keys:
            retries = rng.randint(1, 5)
            concurrent = rng.randint(1, min(2, retries)) if rng.random() < 0.6 else 0
            threads = [threading.Thread(target=send, args=(key,), daemon=True) for _ in range(concurrent)]
            for thread in threads:
                thread.start()
            send(key)  # the original, racing its concurrent retries
            for thread in threads:
                thread.join(60)
            for _ in range(retries - concurrent):
                if rng.random() < 0.3:
                    time.sleep(rng.uniform(0, 0.05))
                send(key)

    started = time.monotonic()
    shards = [keys[i::clients] for i in range(clients)]
    threads = [threading.Thread(target=client, args=(shard, ctx.seed * 1000 + i), daemon=True)
               for i, shard in enumerate(shards)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(1.0, 600 - (time.monotonic() - started)))
    if any(t.is_alive() for t in threads):
        result.problem("storm clients still running after 600 s")
    intake_seconds = time.monotonic() - started
    # a key whose every answer was 409 or an error gets one patient retry, so the check below is about Herald
    for key in keys:
        if not any(r.status == 202 for r in replies[key]):
            replies[key].extend(tenant.api.post_retrying(EVENTS, bodies[key], key, budget=30))
    all_replies = [r for rs in replies.values() for r in rs]
    result.inputs = len(all_replies)
    result.details["answers"] = answer_summary(all_replies)
    result.details["intake_seconds"] = round(intake_seconds, 1)
    result.details["requests_per_second"] = round(len(all_replies) / max(intake_seconds, 0.001), 1)
    bad_keys = {}
    for key in keys:
        problems = checks.key_answer_problems(replies[key])
        if problems:
            bad_keys[key] = problems
    if bad_keys:
        sample = next(iter(bad_keys.items()))
        result.problem(f"{len(bad_keys)} keys got an answer other than their first 202 or a 409 in progress, "
                       f"e.g. {sample[0]}: {sample[1][:2]}")
    event_ids = check_intake(result, ctx, tenant, replies, keys)
    events_by_key = ctx.db.events_by_key(tenant.tenant_id)
    fanned = {event_id for key, ids in events_by_key.items() if bodies.get(key, {}).get("type") == "storm.fanout"
              for event_id in ids}
    check_delivered(result, ctx, tenant, [receiver], event_ids, profile.settle_seconds, duplicates_allowed=False,
                    fanout=[(fan, path, fanned) for path in fan_paths])
    return result


# ---------------------------------------------------------------- 2. a worker killed mid-delivery


def worker_kill(ctx: Context) -> Result:
    """SIGKILL a worker holding hundreds of attempts in flight; a new worker and beat must lose none of them."""
    profile = ctx.profile
    stack = ctx.stack
    n = profile.kill_events
    slow = 1.5
    result = Result("worker-kill", load=f"{n} events queued → receiver slow 200 ({slow:g}s), one worker of 300 threads")
    tenant = ctx.tenant("kill")
    receiver = ctx.receivers.new("kill", Slow(slow))
    ctx.endpoint(tenant, receiver, ["kill.*"], max_in_flight=1000)
    bodies = _bodies("kill", ctx.run_id, n)
    # The queue fills while no worker runs, so the victim takes hundreds of deliveries at once.
    stack.stop_workers()
    load = Load(tenant.api, bodies, clients=8, budget=60).start()
    if not load.wait(180):
        result.problem("intake clients still running after 180 s")
    victim = stack.start_worker(WEBHOOK_WORKER_CONCURRENCY="300")
    name = next(name for name, proc in stack.workers().items() if proc is victim)

    def held_by_victim():
        peers = receiver.inflight()
        owners = socket_owners({port for port, _ in peers})
        pids = set(victim.pids())
        ids = [wid for port, wid in peers if owners.get(port) in pids]
        return ids if len(ids) >= KILL_MIN_IN_FLIGHT else None

    try:
        in_flight = wait_until(held_by_victim, 60, 0.05, f"{KILL_MIN_IN_FLIGHT} deliveries in flight in one worker")
    except TimeoutError:
        result.problem(f"the worker never held {KILL_MIN_IN_FLIGHT} deliveries in flight; nothing was killed")
        stack.start_worker()  # back to two workers for the next scenarios
        return result
    pids = victim.pids()
    before = stack.pid_snapshot()
    killed_at = time.monotonic()
    victim.kill()
    stack.procs.pop(name).stop()
    stack.log(f"worker-kill: SIGKILL process group {victim.pgid} of {name} (pids {pids}) with {len(in_flight)} "
              f"in flight")
    result.faults = f"SIGKILL {name} ({len(in_flight)} attempts in flight)"
    for _ in range(2):
        stack.start_worker()
    result.notes.append(f"started two workers {time.monotonic() - killed_at:.1f}s after the kill")
    result.inputs = len(load.all_replies())
    result.details["answers"] = answer_summary(load.all_replies())
    event_ids = check_intake(result, ctx, tenant, load.replies, list(bodies))
    check_delivered(result, ctx, tenant, [receiver], event_ids, profile.settle_seconds, duplicates_allowed=True)
    check_survivors(result, stack, before, spared=(name,))
    by_id = receiver.by_id()
    recovery = []
    for webhook_id in in_flight:
        later = [h for h in by_id.get(webhook_id, []) if h.arrived > killed_at and h.answered == 200]
        if later:
            recovery.append(later[0].arrived - killed_at)
        else:
            result.problem(f"{webhook_id}, in flight at the kill, was never sent again successfully")
    if recovery:
        result.details["recovery_seconds"] = sorted(round(s, 1) for s in recovery)
        if max(recovery) > RECOVERY_LIMIT:
            result.problem(f"a killed worker's delivery came back after {max(recovery):.1f}s "
                           f"(SPEC §6: within {RECOVERY_LIMIT:g}s)")
        result.notes.append(f"{len(in_flight)} in-flight deliveries sent again {min(recovery):.1f}-"
                            f"{max(recovery):.1f}s after the kill")
    return result


# ---------------------------------------------------------------- 3. the broker lost: restart, or FLUSHALL


def broker(ctx: Context, mode: str) -> Result:
    profile = ctx.profile
    stack = ctx.stack
    n = profile.broker_events
    prefix = "brokerrestart" if mode == "restart" else "brokerflush"
    result = Result(f"broker-{mode}", load=f"{n} events, 8 clients, then 20/s through the fault → receiver slow 200 "
                                            f"(0.2s)")
    tenant = ctx.tenant(prefix)
    receiver = ctx.receivers.new(prefix, Slow(0.2))
    ctx.endpoint(tenant, receiver, [f"{prefix}.*"])
    bodies = _bodies(prefix, ctx.run_id, n)
    before = stack.pid_snapshot()
    failed_publishes_before = _failed_publishes(stack)
    load = Load(tenant.api, bodies, clients=8, budget=60).start()
    try:
        wait_until(lambda: load.done >= n // 3, 120, 0.05, "a third of the events to be accepted")
    except TimeoutError:
        result.problem("intake too slow: a third of the events not accepted within 120 s")
    if stack.rabbitmq:
        queued = f"{sum(stack.rabbitmq.queues().values())} messages queued"
    else:
        queued = f"{sum(len(ids) for name, ids in stack.redis.queued_tasks() if name == 'webhooks.deliver_many')}" \
                 " tasks queued"
    # events keep coming while the broker is down, so the relays publish into the outage
    through: dict[str, list[Reply]] = {}
    stream = threading.Thread(target=lambda: through.update(_steady_intake(ctx, tenant, prefix, "through", 20, 6)[0]),
                              daemon=True)
    stream.start()
    if mode == "restart":
        health_during: list[str] = []
        stopped_at = time.monotonic()

        def probe():
            for _ in range(6):
                asked = time.monotonic() - stopped_at
                health_during.append(f"{asked:.1f}-{time.monotonic() - stopped_at:.1f}s "
                                     f"{stack.health()[1].get('broker')}")
                time.sleep(0.3)
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        if stack.rabbitmq:
            stack.rabbitmq.restart(down_seconds=4.0)
            result.faults = f"rabbitmq stop_app, 4s down, start_app ({queued}; durable queues)"
        else:
            stack.redis.stop()
            time.sleep(4.0)
            stack.redis.start()
            result.faults = f"redis killed, 4s down, restarted empty ({queued})"
        prober.join(10)
        result.details["healthz_broker_during_outage"] = health_during
    elif stack.rabbitmq:
        result.faults = f"every queue purged: {stack.rabbitmq.purge()}"
    else:
        reply = stack.redis.flushall()
        result.faults = f"FLUSHALL ({queued}) → {reply}"
    stack.log(f"broker-{mode}: {result.faults}")
    stream.join(90)
    if not load.wait(240) or stream.is_alive():
        result.problem("intake clients still running after 240 s")
    replies = {**load.replies, **through}
    all_replies = [r for rs in replies.values() for r in rs]
    result.inputs = len(all_replies)
    result.details["answers"] = answer_summary(all_replies)
    failed = _failed_publishes(stack) - failed_publishes_before
    result.details["relay_publishes_failed"] = failed
    if failed:
        result.notes.append(f"{failed} relay publishes failed during the fault; their deliveries were made due again")
    event_ids = check_intake(result, ctx, tenant, replies, list(bodies) + list(through))
    check_delivered(result, ctx, tenant, [receiver], event_ids, profile.settle_seconds, duplicates_allowed=False)
    check_survivors(result, stack, before)
    return result


def _failed_publishes(stack: Stack) -> int:
    """Publishes the broker refused (or did not confirm), as the workers logged them so far."""
    return sum(proc.output().count("delivery.enqueue_failed") for proc in stack.workers().values())


def broker_restart(ctx: Context) -> Result:
    return broker(ctx, "restart")


def broker_flush(ctx: Context) -> Result:
    return broker(ctx, "flush")


# ---------------------------------------------------------------- 4. the database restarted under intake


def db_restart(ctx: Context) -> Result:
    profile = ctx.profile
    stack = ctx.stack
    n, clients = profile.db_events, profile.db_clients
    result = Result("db-restart", load=f"{n} events, {clients} clients, ≤60s/request")
    tenant = ctx.tenant("db")
    receiver = ctx.receivers.new("db", AlwaysOk())
    ctx.endpoint(tenant, receiver, ["db.*"])
    bodies = _bodies("db", ctx.run_id, n)
    pids_before = stack.pid_snapshot()
    load = Load(tenant.api, bodies, clients=clients, budget=60).start()
    try:
        wait_until(lambda: load.done >= n // 3, 120, 0.05, "a third of the events to be accepted")
    except TimeoutError:
        result.problem("intake too slow: a third of the events not accepted within 120 s")
    restarted_at = time.monotonic()
    downtime = stack.pg.restart()
    result.faults = f"pg_ctl restart -m fast ({downtime:.1f}s)"
    stack.log(f"db-restart: {result.faults}")
    if not load.wait(240):
        result.problem("intake clients still running after 240 s")
    all_replies = load.all_replies()
    result.inputs = len(all_replies)
    result.details["answers"] = answer_summary(all_replies)
    felt = [r for r in all_replies if r.status is None or r.status >= 500
            or (r.status == 409 and r.code == "idempotency_key_in_progress")]
    result.notes.append(f"clients felt the restart {len(felt)} times (5xx, no answer or 409 in progress), "
                        "then retried with the same key")
    if felt:
        result.details["last_failure_after_restart_seconds"] = round(
            max(r.sent + r.elapsed for r in felt) - restarted_at, 1)
    event_ids = check_intake(result, ctx, tenant, load.replies, list(bodies))
    check_delivered(result, ctx, tenant, [receiver], event_ids, profile.settle_seconds, duplicates_allowed=True)
    pids_after = stack.pid_snapshot()
    changed = [name for name in pids_before if pids_before[name] != pids_after.get(name)]
    check_survivors(result, stack, pids_before)
    if changed:
        result.problem(f"Herald processes changed across the restart (restarted or died): {changed}")
    else:
        result.notes.append("every gunicorn and Celery process kept its pid: no restart needed")
    return result


# ---------------------------------------------------------------- 5. flapping receivers


def flapping(ctx: Context) -> Result:
    profile = ctx.profile
    n = profile.flap_events
    result = Result("flapping", load=f"{n} events → 3 flapping receivers + a fifo one + 1 event → 410")
    tenant = ctx.tenant("flap")
    behaviours = {
        "flapa": Flapping(timeout=TIMEOUT_SECONDS, label="balanced"),
        "flapb": Flapping(timeout=TIMEOUT_SECONDS, ok=0.1, e500=0.4, e503=0.25, hang=0.1, slow=0.15,
                          label="mostly-failing"),
        "flapc": Flapping(timeout=TIMEOUT_SECONDS, ok=0.25, e500=0.1, e503=0.1, hang=0.35, slow=0.2,
                          label="hang-heavy"),
        "gone": Gone(),
        # fifo: one at a time in event order, whatever the receiver does to each attempt
        "fifo": Flapping(timeout=TIMEOUT_SECONDS, ok=0.6, e500=0.2, e503=0.1, hang=0.0, slow=0.1, label="fifo"),
    }
    receivers: dict[str, Receiver] = {}
    endpoint_of: dict[str, str] = {}
    for index, (prefix, behaviour) in enumerate(behaviours.items()):
        receiver = receivers[prefix] = ctx.receivers.new(prefix, behaviour, seed=ctx.seed * 100 + index)
        options = {"ordering": "fifo"} if prefix == "fifo" else {}
        endpoint_of[ctx.endpoint(tenant, receiver, [f"{prefix}.*"], **options)["id"]] = prefix
    bodies = {}
    prefixes = ["flapa", "flapb", "flapc"]
    for i in range(n):
        key = f"flap-{ctx.run_id}-{i:05d}"
        bodies[key] = event_body(prefixes[i % 3], key, i)
    gone_key = f"gone-{ctx.run_id}-00000"
    bodies[gone_key] = event_body("gone", gone_key, 0)
    # The fifo endpoint's events come from one client, each posted after the previous one's 202: an
    # order the platform means (events posted at the same moment by several clients have none).
    fifo_bodies = {f"fifo-{ctx.run_id}-{i:05d}": event_body("fifo", f"fifo-{ctx.run_id}-{i:05d}", i)
                   for i in range(max(1, n // 3))}
    load = Load(tenant.api, bodies, clients=8, budget=60).start()
    fifo_load = Load(tenant.api, fifo_bodies, clients=1, budget=60).start()
    if not load.wait(180) or not fifo_load.wait(180):
        result.problem("intake clients still running after 180 s")
    load.replies.update(fifo_load.replies)
    bodies.update(fifo_bodies)
    result.inputs = len(load.all_replies())
    result.faults = "random 500 / 503+Retry-After / hang / slow; 410"
    event_ids = check_intake(result, ctx, tenant, load.replies, list(bodies))
    pending: dict = {}

    def settled():
        nonlocal pending
        pending = {d["id"] for d in ctx.db.deliveries(tenant.tenant_id).values() if d["status"] == "pending"}
        return not pending
    try:
        wait_until(settled, profile.settle_seconds + 60, 1.0, "every flapping delivery to settle")
    except TimeoutError:
        result.lost += len(pending)
        result.problem(f"{len(pending)} deliveries still pending after {profile.settle_seconds + 60:.0f}s")
    try:
        wait_until(lambda: not any(r.inflight() for r in receivers.values()), 15, 0.2, "receivers to go idle")
    except TimeoutError:
        result.notes.append("receivers still busy 15 s after settling")
    deliveries = ctx.db.deliveries(tenant.tenant_id)
    attempts = ctx.db.attempts(tenant.tenant_id)
    by_receiver = {prefix: receiver.by_id() for prefix, receiver in receivers.items()}
    untruthful, tolerated, early = [], [], []
    outcome = Counter()
    for delivery in deliveries.values():
        if delivery["event_id"] not in event_ids:
            continue
        prefix = endpoint_of.get(delivery["endpoint_id"], "?")
        hits = by_receiver.get(prefix, {}).get(delivery["event_id"], [])
        truth = checks.attempt_truth(hits, attempts.get(delivery["id"], []), delivery,
                                     schedule_len=len(RETRY_SCHEDULE), timeout=TIMEOUT_SECONDS)
        if truth.problems:
            untruthful.append((delivery["id"], prefix, truth.problems))
        tolerated.extend(truth.tolerated)
        early.extend(checks.retry_gap_problems(hits, RETRY_SCHEDULE, JITTER))
        outcome[(prefix, delivery["status"])] += 1
    if untruthful:
        result.problem(f"{len(untruthful)} deliveries whose attempts or status contradict the receiver, e.g. "
                       f"{untruthful[0][0]} ({untruthful[0][1]}): {list(untruthful[0][2])[:3]}")
        result.details["untruthful"] = untruthful[:20]
    if early:
        result.problem(f"{len(early)} retries earlier than the schedule allows, e.g. {early[0]}")
    if tolerated:
        result.notes.append(f"{len(tolerated)} slow answers at the timeout's edge recorded as timeouts (tolerated)")
    gone_deliveries = [d for d in deliveries.values() if endpoint_of.get(d["endpoint_id"]) == "gone"]
    for delivery in gone_deliveries:
        if delivery["status"] != "failed" or delivery["attempt_count"] != 1:
            result.problem(f"410 delivery ended {delivery['status']} after {delivery['attempt_count']} attempts")
        if ctx.db.endpoint_enabled(delivery["endpoint_id"]):
            result.problem("the endpoint that answered 410 is still enabled")
    fifo_id = next(endpoint for endpoint, prefix in endpoint_of.items() if prefix == "fifo")
    posted = [reply.json()["id"] for key in fifo_bodies for reply in fifo_load.replies.get(key, [])[-1:]
              if reply.status == 202]
    in_order = [d["event_id"] for d in sorted(deliveries.values(), key=lambda d: d["id"])
                if d["endpoint_id"] == fifo_id]
    if posted != in_order:
        result.problem("the fifo endpoint's deliveries are not in the order their events were posted in")
    sent: list[str] = []
    for hit in sorted(receivers["fifo"].snapshot(), key=lambda h: h.arrived):
        if not sent or sent[-1] != hit.webhook_id:
            sent.append(hit.webhook_id)
    if sent != in_order:
        result.problem(f"the fifo endpoint received its webhooks out of event order or interleaved: "
                       f"{len(sent)} runs for {len(in_order)} events")
        result.details["fifo_sent"], result.details["fifo_event_order"] = sent, in_order
    fifo_peak = checks.max_overlap(ctx.db.attempt_intervals(fifo_id))
    if fifo_peak > 1:
        result.problem(f"the fifo endpoint had {fifo_peak} attempts in flight at once")
    result.notes.append(f"fifo endpoint: {len(in_order)} webhooks in event order, one at a time, through "
                        f"{len(receivers['fifo'].snapshot())} requests")
    kinds = Counter(h.plan.kind for r in receivers.values() for h in r.snapshot())
    result.details["answers_given"] = dict(kinds)
    result.details["outcomes"] = {f"{p}:{s}": c for (p, s), c in sorted(outcome.items())}
    result.details["attempts_recorded"] = sum(len(a) for a in attempts.values())
    result.notes.append("outcomes " + ", ".join(f"{p} {s} {c}" for (p, s), c in sorted(outcome.items())))
    check_receivers(result, list(receivers.values()), duplicates_allowed=True)
    # a second 2xx for one webhook is already judged by attempt_truth ("an attempt after a 2xx")
    return result


# ---------------------------------------------------------------- 6. isolation: a hanging neighbour, a breaker


def noisy_neighbour(ctx: Context, via_platform: bool = False) -> Result:
    """An endpoint that hangs past the timeout with a backlog; a healthy endpoint of the same tenant must not wait.

    `via_platform` (noisy-neighbour-platform): the two endpoints belong to two tenants that one platform
    credential created and acts for, each endpoint subscribed to every type: the slow tenant must not hold
    the other back, and neither endpoint may receive an event of the other tenant."""
    profile = ctx.profile
    name = "noisy-neighbour-platform" if via_platform else "noisy-neighbour"
    result = Result(name, load=f"{profile.hang_events} events → a hanging endpoint, then 10/s for "
                               f"{profile.neighbour_seconds:g}s → a healthy one"
                               + (" of another tenant, one platform credential" if via_platform else ""))
    suffix = "-p" if via_platform else ""
    tenant = ctx.tenant(f"neighbour{suffix}", via_platform=via_platform)
    other = ctx.tenant("neighbour-healthy-p", via_platform=True) if via_platform else tenant
    hanging = ctx.receivers.new(f"hang{suffix}", Hang(TIMEOUT_SECONDS))
    healthy = ctx.receivers.new(f"healthy{suffix}", AlwaysOk())
    hang_endpoint = ctx.endpoint(tenant, hanging, [] if via_platform else ["hang.*"])
    ctx.endpoint(other, healthy, [] if via_platform else ["healthy.*"])
    cap = hang_endpoint["max_in_flight"]
    hang_bodies = _bodies("hang", ctx.run_id + suffix, profile.hang_events)
    Load(tenant.api, hang_bodies, clients=8, budget=60).start().wait(120)
    try:
        wait_until(lambda: len(hanging.inflight()) >= cap, 30, 0.05, f"{cap} attempts hanging")
    except TimeoutError:
        result.problem(f"the hanging endpoint never had {cap} attempts in flight")
    result.faults = f"receiver holds every request past the {TIMEOUT_SECONDS:g}s timeout"
    posted: dict[str, float] = {}  # event id → when its 202 came back (monotonic)
    replies = []
    count = int(profile.neighbour_seconds * 10)
    start = time.monotonic()
    for i in range(count):
        delay = start + i / 10 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        key = f"healthy-{ctx.run_id}{suffix}-{i:05d}"
        reply = other.api.post(EVENTS, event_body("healthy", key, i), key)
        replies.append(reply)
        if reply.status == 202:
            posted[reply.json()["id"]] = reply.sent + reply.elapsed
    result.inputs = len(replies) + len(hang_bodies)
    missing = healthy.wait_for_ids(set(posted), 30)
    if missing:
        result.lost += len(missing)
        result.problem(f"{len(missing)} of {len(posted)} healthy deliveries never arrived")
    first = {}
    for hit in healthy.snapshot():
        if hit.webhook_id in posted and hit.answered == 200:
            first.setdefault(hit.webhook_id, hit.arrived)
    latencies = sorted(first[i] - posted[i] for i in first)
    if latencies:
        p99 = checks.percentile(latencies, 99)
        result.details["healthy_latency_ms"] = {"p50": round(checks.percentile(latencies, 50) * 1000, 1),
                                                "p99": round(p99 * 1000, 1), "max": round(latencies[-1] * 1000, 1)}
        result.notes.append(f"healthy endpoint: post-to-arrival p50 {checks.percentile(latencies, 50) * 1000:.0f} ms, "
                            f"p99 {p99 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms")
        if p99 > 1.0:
            result.problem(f"a healthy endpoint waited behind a hanging one: p99 {p99 * 1000:.0f} ms (limit 1 s)")
    herald_peak = checks.max_overlap(ctx.db.attempt_intervals(hang_endpoint["id"]))
    receiver_peak = checks.max_overlap(hanging.intervals())
    result.details["hanging_in_flight_peak"] = {"herald_records": herald_peak, "receiver": receiver_peak, "cap": cap}
    result.notes.append(f"hanging endpoint: at most {herald_peak} attempts in flight by Herald's records, "
                        f"{receiver_peak} seen by the receiver (cap {cap})")
    if herald_peak > cap:
        result.problem(f"the hanging endpoint had {herald_peak} attempts in flight (cap {cap})")
    health = ctx.db.endpoint_health(hang_endpoint["id"])
    result.details["hanging_endpoint_health"] = health
    check_receivers(result, [healthy], duplicates_allowed=False)
    if via_platform:  # each tenant's endpoint got its own tenant's events only
        for receiver, owner, stranger in ((hanging, tenant, other), (healthy, other, tenant)):
            own = {i for ids in ctx.db.events_by_key(owner.tenant_id).values() for i in ids}
            foreign = {hit.webhook_id for hit in receiver.snapshot()} - own
            theirs = {i for ids in ctx.db.events_by_key(stranger.tenant_id).values() for i in ids}
            result.details[f"{receiver.name}_foreign_webhooks"] = len(foreign)
            if foreign:
                result.problem(f"{len(foreign)} webhooks at tenant {owner.name}'s endpoint are not its events "
                               f"({len(foreign & theirs)} of them tenant {stranger.name}'s), e.g. {sorted(foreign)[:2]}")
    # the hanging endpoint's backlog is not this scenario's business: cancel it so it does not load the next ones
    tenant.api.request("DELETE", f"/api/v1/endpoints/{hang_endpoint['id']}")
    return result


# The quiet tenant's post -> first attempt p99 behind the loud burst. On 2 cores shared with other work (load 5-7)
# it measured 0.68-1.41 s over ten runs (0.05 s alone just before), so 1 s failed three of them; the bench's
# `fairness` part measures the scheduler itself (SPEC §10's 300 ms), this guards against a quiet tenant waiting
# out a loud one's backlog (36.5 s at p99 before fair scheduling, with a larger one).
FAIR_P99_LIMIT = 2.0
FAIR_LOUD_CLIENTS = 4
FAIR_MIN_SAMPLES = 10  # quiet posts that must fall inside the loud backlog for the p99 to mean anything


def fairness(ctx: Context) -> Result:
    """A loud tenant's burst beside a quiet tenant (SPEC §10), both created by one platform credential that acts
    for them: the quiet tenant posts one event every 100 ms to its one endpoint while the loud one's burst, fanned
    out to `fair_fanout` endpoints of a fast receiver, is posted and worked off. The quiet tenant's POST -> first
    attempt (Herald's own `started_at`) must stay under FAIR_P99_LIMIT at p99 over the events it posted before the
    burst's last first attempt; every delivery of both arrives, once."""
    profile = ctx.profile
    total = profile.fair_events * profile.fair_fanout
    result = Result("fairness", load=f"tenant A: {profile.fair_events} events x {profile.fair_fanout} endpoints = "
                                     f"{total:,} deliveries; tenant B: 1 event/100 ms, one platform credential",
                    faults="tenant A's burst ahead of tenant B in every shared queue")
    loud, quiet = ctx.tenant("fair-loud", via_platform=True), ctx.tenant("fair-quiet", via_platform=True)
    loud_rx = ctx.receivers.new("fair-loud", AlwaysOk())
    quiet_rx = ctx.receivers.new("fair-quiet", AlwaysOk())
    paths = []
    for index in range(profile.fair_fanout):
        ctx.endpoint(loud, loud_rx, [], suffix=str(index))
        paths.append(loud_rx.path_url(str(index))[0])
    ctx.endpoint(quiet, quiet_rx, [])
    posted: dict[str, float] = {}  # quiet event id -> time.time() just before its POST
    quiet_replies: dict[str, list[Reply]] = {}

    def quiet_posts(seconds: float, phase: str, until=lambda: False) -> None:
        start = time.monotonic()
        for i in range(int(seconds * 10)):
            if until():
                return
            delay = start + i / 10 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            key = f"fair-quiet-{ctx.run_id}-{phase}-{i:05d}"
            before = time.time()
            reply = quiet.api.post(EVENTS, event_body("quiet", key, i), key)
            quiet_replies[key] = [reply]
            if reply.status == 202:
                posted[reply.json()["id"]] = before

    quiet_posts(0.5, "warm")  # the quiet endpoint's first deliveries (a worker's first look at it) are not timed
    posted.clear()
    quiet_posts(2, "alone")  # what this machine gives B now, for the report
    alone = dict(posted)
    try:  # every one attempted before the burst starts (their figure is the machine's, alone)
        wait_until(lambda: set(alone) <= {e for e, _, _ in ctx.db.first_attempt_starts(quiet.tenant_id)},
                   30, 0.1, "tenant B's first events attempted")
    except TimeoutError:
        result.problem("tenant B's events posted alone were not all attempted within 30 s")
    bodies = _bodies("loud", ctx.run_id, profile.fair_events)
    # FAIR_LOUD_CLIENTS: the burst (each event fair_fanout deliveries) leaves half of gunicorn's threads (2 x 4) to
    # the quiet tenant: with 16 clients its POSTs alone waited up to 0.6 s for a thread, and sharing intake between
    # tenants is not this scenario's business.
    load = Load(loud.api, bodies, clients=FAIR_LOUD_CLIENTS, budget=60, seed=ctx.seed).start()
    burst_started = time.time()

    def burst_delivered() -> bool:
        return len({(hit.path, hit.webhook_id) for hit in loud_rx.snapshot() if hit.answered == 200}) >= total

    quiet_posts(profile.fair_seconds, "beside", until=burst_delivered)
    if not load.wait(120):
        result.problem("tenant A's burst was still being posted after 120 s")
    result.inputs = len(load.all_replies()) + len(quiet_replies)
    loud_ids = check_intake(result, ctx, loud, load.replies, list(bodies))
    quiet_ids = check_intake(result, ctx, quiet, quiet_replies, list(quiet_replies))
    check_delivered(result, ctx, loud, [], set(), profile.settle_seconds, duplicates_allowed=False,
                    fanout=[(loud_rx, path, loud_ids) for path in paths])
    loud_status = result.details.get("delivery_status")
    check_delivered(result, ctx, quiet, [quiet_rx], quiet_ids, 30, duplicates_allowed=False)
    loud_starts = [at for _, at, _ in ctx.db.first_attempt_starts(loud.tenant_id)]
    backlog_end = max(loud_starts, default=burst_started)
    first = {event: (at, created) for event, at, created in ctx.db.first_attempt_starts(quiet.tenant_id)}
    waits_alone = [first[e][0] - alone[e] for e in alone if e in first]
    beside = {e: t for e, t in posted.items() if e not in alone and burst_started <= t < backlog_end}
    waits = [first[e][0] - beside[e] for e in beside if e in first]
    committed = [first[e][0] - first[e][1] for e in beside if e in first]  # the event's commit -> first attempt
    result.details["quiet_alone_waits_ms"] = [round((first[e][0] - alone[e]) * 1000) for e in alone if e in first]
    result.details["quiet_waits_ms"] = [(round(beside[e] - burst_started, 2), round((first[e][0] - beside[e]) * 1000))
                                        for e in sorted(beside, key=beside.get) if e in first]
    result.details.update({"loud_deliveries": total, "loud_backlog_seconds": round(backlog_end - burst_started, 1),
                           "quiet_posts_beside_backlog": len(beside), "quiet_posts": len(quiet_replies),
                           "loud_delivery_status": loud_status,
                           "quiet_delivery_status": result.details.get("delivery_status")})
    if waits_alone:
        result.details["quiet_alone_ms"] = {"p50": round(checks.percentile(waits_alone, 50) * 1000, 1),
                                            "p99": round(checks.percentile(waits_alone, 99) * 1000, 1)}
    if len(waits) < FAIR_MIN_SAMPLES:
        result.problem(f"only {len(waits)} of tenant B's events were posted while tenant A's burst was worked off "
                       f"({backlog_end - burst_started:.1f} s): too few to judge (want {FAIR_MIN_SAMPLES})")
    if waits:
        p50, p99 = checks.percentile(waits, 50), checks.percentile(waits, 99)
        result.details["quiet_beside_ms"] = {"p50": round(p50 * 1000, 1), "p99": round(p99 * 1000, 1),
                                             "max": round(max(waits) * 1000, 1)}
        result.details["quiet_commit_to_attempt_ms"] = {"p50": round(checks.percentile(committed, 50) * 1000, 1),
                                                        "p99": round(checks.percentile(committed, 99) * 1000, 1)}
        result.notes.append(
            f"tenant B post -> first attempt over {len(waits)} events during tenant A's {total:,}-delivery burst "
            f"({backlog_end - burst_started:.1f} s): p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms (limit "
            f"{FAIR_P99_LIMIT * 1000:.0f}; of it, the event's commit -> first attempt p99 "
            f"{checks.percentile(committed, 99) * 1000:.0f} ms); alone just before p99 "
            f"{checks.percentile(waits_alone, 99) * 1000 if waits_alone else float('nan'):.0f} ms")
        if p99 > FAIR_P99_LIMIT:
            result.problem(f"tenant B waited behind tenant A's burst: post -> first attempt p99 {p99 * 1000:.0f} ms "
                           f"(limit {FAIR_P99_LIMIT * 1000:.0f})")
    return result


def breaker(ctx: Context) -> Result:
    """A receiver that fails until it is fixed: the breaker trips, probes, recovers, and nothing is lost."""
    profile = ctx.profile
    n = profile.breaker_events
    result = Result("breaker", load=f"{n} events → a receiver answering 500 until switched to 200")
    tenant = ctx.tenant("breaker")
    switch = Switch()
    broken = ctx.receivers.new("broken", switch)
    monitor = ctx.receivers.new("monitor", AlwaysOk())
    endpoint = ctx.endpoint(tenant, broken, ["brk.*"])
    ctx.endpoint(tenant, monitor, ["herald.*"])
    bodies = _bodies("brk", ctx.run_id, n)
    load = Load(tenant.api, bodies, clients=4, budget=60).start()
    result.faults = "500 on every request, then 200"

    def operational(event_type: str) -> list[dict]:
        return [body["data"] for hit in monitor.snapshot() if hit.verified and hit.answered == 200
                for body in [json.loads(hit.body)] if body["type"] == event_type]

    def tripped_event():
        return [e for e in operational("herald.endpoint.tripped") if e["endpoint_id"] == endpoint["id"]]

    try:
        wait_until(tripped_event, 60, 0.1, "herald.endpoint.tripped at the monitor")
    except TimeoutError:
        result.problem("the breaker never tripped (no herald.endpoint.tripped arrived)")
    tripped_at = time.monotonic()
    state = tenant.api.get(f"/api/v1/endpoints/{endpoint['id']}").json()["health"]
    result.details["health_while_tripped"] = state
    if state["state"] != "tripped":
        result.problem(f"GET /endpoints/{{id}} shows health {state['state']!r} while tripped")
    time.sleep(4)  # long enough for the first probes (pauses of 1 s, then 2 s, in this suite)
    probes = [h for h in broken.snapshot() if h.arrived > tripped_at]
    switch.failing.clear()
    switched_at = time.monotonic()
    load.wait(120)
    result.inputs = len(load.all_replies())
    gaps = [b.arrived - a.arrived for a, b in zip(probes, probes[1:])]
    result.details["probes_while_tripped"] = len(probes)
    result.notes.append(f"{len(probes)} probe(s) in the 4 s after the trip; gaps {[round(g, 2) for g in gaps]}")
    if checks.max_overlap([(h.arrived, h.finished or h.arrived) for h in probes]) > 1:
        result.problem("more than one probe at a time while tripped")
    if any(gap < 0.9 for gap in gaps):
        result.problem(f"attempts while tripped came closer than the pause allows: {gaps}")
    if len(probes) > 3:
        result.problem(f"{len(probes)} attempts while tripped in 4 s (pauses of 1 s then 2 s allow at most 3)")
    try:
        wait_until(lambda: [e for e in operational("herald.endpoint.recovered") if e["endpoint_id"] == endpoint["id"]],
                   30, 0.1, "herald.endpoint.recovered at the monitor")
        result.notes.append(f"recovered {time.monotonic() - switched_at:.1f}s after the receiver was fixed")
    except TimeoutError:
        result.problem("no herald.endpoint.recovered arrived after the receiver was fixed")
    event_ids = check_intake(result, ctx, tenant, load.replies, list(bodies))
    # every event arrives although the receiver refused them all at first: waiting for the breaker used
    # up no retry step (the schedule allows 4 attempts)
    check_delivered(result, ctx, tenant, [broken], event_ids, profile.settle_seconds, duplicates_allowed=False)
    attempts = ctx.db.attempts(tenant.tenant_id)
    result.details["attempts_recorded"] = sum(len(a) for a in attempts.values())
    return result


# ---------------------------------------------------------------- 6b. slow and greedy clients

SIEGE_CONNECTIONS = 50  # trickling heads, and as many trickling bodies
CLIENT_TIMEOUT = 10.0  # WEB_CLIENT_TIMEOUT_SECONDS, Herald's default (not overridden by this suite)
RATE_LIMIT = 20  # INTAKE_RATE_LIMIT_PER_SECOND for the rate-limit scenario (burst: one second's worth)


def slow_clients(ctx: Context) -> Result:
    """Slowloris: 50 connections trickling their heads and 50 trickling their bodies, each re-opened as the
    server cuts it, while a normal client posts events and checks /healthz; then oversized and odd requests."""
    profile, stack = ctx.profile, ctx.stack
    seconds = profile.slow_seconds
    result = Result("slow-clients", load=f"events and /healthz one after another for {seconds:.0f}s",
                    faults=f"{SIEGE_CONNECTIONS} trickled heads + {SIEGE_CONNECTIONS} trickled bodies (1 piece/s, "
                           f"re-opened when cut); oversized heads and bodies; a body at 1 byte/s")
    tenant = ctx.tenant("slow")
    receiver = ctx.receivers.new("slow", AlwaysOk())
    ctx.endpoint(tenant, receiver, ["slow.*"])
    host, port = "127.0.0.1", stack.web_port
    odd: dict[str, slowclients.Answer] = {}

    def odd_requests():
        head = b"POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n" % tenant.token.encode()
        odd["head over 16 KiB"] = slowclients.exchange(host, port, head + b"X-Big: " + b"a" * 17_000 + b"\r\n\r\n")
        odd["10,000 headers"] = slowclients.exchange(host, port, head + b"".join(b"X-%d: v\r\n" % i for i in range(10_000))
                                                     + b"\r\n")
        odd["Content-Length 1 GB"] = slowclients.exchange(
            host, port, head + b"Idempotency-Key: odd-gigabyte-0001\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 1073741824\r\n\r\n")
        body = b'{"type": "slow.odd", "data": {}}'
        odd["body at 1 byte/s"] = slowclients.exchange(
            host, port, head + b"Idempotency-Key: odd-trickle-0001\r\nContent-Type: application/json\r\n"
                               b"Content-Length: %d\r\n\r\n" % len(body),
            then=[(1.0, body[i:i + 1]) for i in range(len(body))], timeout=CLIENT_TIMEOUT + 10)

    siege = slowclients.Siege(host, port, SIEGE_CONNECTIONS, SIEGE_CONNECTIONS)
    siege.start()
    time.sleep(1.5)   # every siege connection has sent its first bytes
    odd_thread = threading.Thread(target=odd_requests, daemon=True)
    odd_thread.start()
    replies: dict[str, list[Reply]] = {}
    health: list[Reply] = []
    deadline, n = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        key = f"slow-{ctx.run_id}-{n}"
        replies[key] = [tenant.api.post(EVENTS, event_body("slow", key, n), key)]
        health.append(tenant.api.request("GET", "/healthz", timeout=10))
        n += 1
    siege.stop()
    odd_thread.join(CLIENT_TIMEOUT + 15)
    result.inputs = len(replies) + len(health)

    normal = [r for rs in replies.values() for r in rs] + health
    latencies = [r.elapsed for r in normal]
    p99 = checks.percentile(latencies, 99)
    result.details["normal_requests"] = {"count": len(normal), "p50_s": round(checks.percentile(latencies, 50), 3),
                                         "p99_s": round(p99, 3), "max_s": round(max(latencies), 3),
                                         "answers": answer_summary(normal)}
    result.notes.append(f"normal requests during the siege: p99 {p99 * 1000:.0f} ms over {len(normal)}")
    if p99 > 1.0:
        result.problem(f"normal requests' p99 was {p99:.2f}s during the siege (limit 1 s)")
    failed = [r.short() for r in normal if r.status not in (200, 202)]
    if failed:
        result.problem(f"{len(failed)} normal requests failed during the siege: {checks.histogram(failed)}")
    cut = siege.finished
    statuses = Counter(t.status for t in cut)
    longest = max((t.cut_after or 0 for t in cut), default=0)
    result.details["siege"] = {"connections_opened": siege.opened, "cut": len(cut),
                               "cut_with": {str(k): v for k, v in statuses.items()}, "longest_s": round(longest, 1)}
    result.notes.append(f"{siege.opened} slow connections opened, {len(cut)} cut (status {dict(statuses)}), "
                        f"none kept more than {longest:.1f}s")
    if not cut or set(statuses) != {408} or longest > CLIENT_TIMEOUT + 1.5:
        result.problem(f"slow connections not all cut with 408 within {CLIENT_TIMEOUT + 1.5:g}s: "
                       f"{dict(statuses)}, longest {longest:.1f}s")
    expected = {"head over 16 KiB": (431, 1.0), "10,000 headers": (431, 1.0), "Content-Length 1 GB": (413, 1.0),
                "body at 1 byte/s": (408, CLIENT_TIMEOUT + 1.5)}
    result.details["odd_requests"] = {name: {"status": a.status, "seconds": round(a.seconds, 2)} for name, a in odd.items()}
    for name, (status, within) in expected.items():
        answer = odd.get(name)
        if answer is None or answer.status != status or answer.seconds > within:
            result.problem(f"{name}: expected {status} within {within:g}s, got "
                           f"{(answer.status, round(answer.seconds, 2)) if answer else 'no answer'}")
    event_ids = check_intake(result, ctx, tenant, replies, list(replies))   # nothing else stored: no strays
    check_delivered(result, ctx, tenant, [receiver], event_ids, profile.settle_seconds, duplicates_allowed=False)
    return result


def front_door(ctx: Context) -> Result:
    """The review's framing attacks on the HTTP reader (issue 21), each repeated from its own connections, beside a
    normal client posting events and checking /healthz: every attack answered 400/413 with the connection closed
    within 1 s, normal requests under 1 s at their worst, nothing of the attacks stored."""
    profile, stack = ctx.profile, ctx.stack
    seconds = profile.door_seconds
    tenant = ctx.tenant("door")
    receiver = ctx.receivers.new("door", AlwaysOk())
    ctx.endpoint(tenant, receiver, ["door.*"])
    address = ("127.0.0.1", stack.web_port)

    def head(framing: bytes) -> bytes:
        return (b"POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nIdempotency-Key: "
                b"door-%s\r\nContent-Type: application/json\r\n%s\r\n" % (tenant.token.encode(),
                                                                           uuid.uuid4().hex.encode(), framing))

    plans = frontdoor.attacks(head)
    result = Result("front-door", load=f"events and /healthz one after another for {seconds:.0f}s",
                    faults="; ".join(plans))
    running = {name: frontdoor.Attack(address, make, count, pieces, hold=0.3)
               for name, (count, make, pieces) in plans.items()}
    for attack in running.values():
        attack.start()
    time.sleep(0.5)
    replies: dict[str, list[Reply]] = {}
    health: list[Reply] = []
    deadline, n = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        key = f"door-{ctx.run_id}-{n}"
        replies[key] = [tenant.api.post(EVENTS, event_body("door", key, n), key)]
        health.append(tenant.api.request("GET", "/healthz", timeout=10))
        n += 1
    for attack in running.values():
        attack.stop()
    normal = [r for rs in replies.values() for r in rs] + health
    latencies = [r.elapsed for r in normal]
    p99, worst = checks.percentile(latencies, 99), max(latencies)
    result.inputs = len(normal) + sum(len(a.answers) for a in running.values())
    result.details["normal_requests"] = {"count": len(normal), "p50_s": round(checks.percentile(latencies, 50), 3),
                                         "p99_s": round(p99, 3), "max_s": round(worst, 3),
                                         "answers": answer_summary(normal)}
    result.notes.append(f"normal requests beside the attacks: p99 {p99 * 1000:.0f} ms, max {worst * 1000:.0f} ms "
                        f"over {len(normal)}")
    if worst > 1.0:
        result.problem(f"a normal request took {worst:.2f}s beside the attacks (limit 1 s)")
    failed = [r.short() for r in normal if r.status not in (200, 202)]
    if failed:
        result.problem(f"{len(failed)} normal requests failed beside the attacks: {checks.histogram(failed)}")
    result.details["attacks"] = {}
    for name, attack in running.items():
        statuses = Counter(a.status for a in attack.answers)
        slowest = max((a.seconds for a in attack.answers), default=0.0)
        open_after = sum(not a.closed for a in attack.answers)
        result.details["attacks"][name] = {"sent": len(attack.answers), "answered": {str(k): v for k, v in statuses.items()},
                                           "slowest_s": round(slowest, 3), "left_open": open_after,
                                           "errors": len(attack.errors)}
        result.notes.append(f"{name}: {len(attack.answers)} sent, answered {dict(statuses)}, slowest "
                            f"{slowest * 1000:.0f} ms (0.3 s of it the client's own wait)")
        if not attack.answers or set(statuses) - {400, 413} or open_after or attack.errors or slowest > 1.0:
            result.problem(f"{name}: expected 400/413 and a closed connection within 1 s each, got {dict(statuses)}, "
                           f"{open_after} left open, {len(attack.errors)} errors, slowest {slowest:.2f}s")
    event_ids = check_intake(result, ctx, tenant, replies, list(replies))   # the attacks stored nothing
    check_delivered(result, ctx, tenant, [receiver], event_ids, profile.settle_seconds, duplicates_allowed=False)
    return result


def rate_limit(ctx: Context) -> Result:
    """gunicorn restarted with INTAKE_RATE_LIMIT_PER_SECOND=20: one credential offers 60/s from six clients, another
    10/s at the same time; the first gets its limit, the excess 429 and never stored, the second is untouched."""
    profile, stack = ctx.profile, ctx.stack
    seconds = profile.rate_seconds
    result = Result("rate-limit", load=f"A: 60 events/s (3x its limit) from 6 clients, B: 10 events/s, {seconds:.0f}s",
                    faults=f"INTAKE_RATE_LIMIT_PER_SECOND={RATE_LIMIT}")
    hammer, bystander = ctx.tenant("hammer"), ctx.tenant("bystander")
    receiver = ctx.receivers.new("ratelimit", AlwaysOk())
    ctx.endpoint(hammer, receiver, ["rl.*"], suffix="hammer")
    ctx.endpoint(bystander, receiver, ["rl.*"], suffix="bystander")
    sent: dict[str, list[tuple[float, str, Reply]]] = {"hammer": [], "bystander": []}
    stack.restart_web("rate-limit scenario", INTAKE_RATE_LIMIT_PER_SECOND=str(RATE_LIMIT))
    try:
        start = time.monotonic() + 0.5

        def client(who: str, tenant: Tenant, per_second: float, offset: float, name: str):
            i = 0
            while True:
                due = start + offset + i / per_second
                if due - start >= seconds:
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                key = f"rl-{who}-{name}-{ctx.run_id}-{i}"
                reply = tenant.api.post(EVENTS, {"type": "rl.tick", "data": {"key": key}}, key)
                sent[who].append((time.monotonic() - start, key, reply))
                i += 1

        threads = [threading.Thread(target=client, args=("hammer", hammer, 10, c / 60, f"c{c}")) for c in range(6)]
        threads.append(threading.Thread(target=client, args=("bystander", bystander, 10, 0, "c0")))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(seconds + 60)
    finally:
        stack.restart_web("rate-limit scenario done")
    hammered, bystood = sent["hammer"], sent["bystander"]
    result.inputs = len(hammered) + len(bystood)
    statuses = Counter(reply.status for _, _, reply in hammered)
    steady = [at for at, _, reply in hammered if reply.status == 202 and 1.0 <= at < seconds]
    rate = len(steady) / (seconds - 1.0)
    b_latencies = [reply.elapsed for _, _, reply in bystood]
    b_p99 = checks.percentile(b_latencies, 99)
    result.details.update({"limit": RATE_LIMIT, "hammer_answers": {str(k): v for k, v in statuses.items()},
                           "hammer_accepted_per_second_after_1s": round(rate, 2),
                           "bystander_answers": answer_summary([r for _, _, r in bystood]),
                           "bystander_p99_s": round(b_p99, 3)})
    result.notes.append(f"A accepted {rate:.1f}/s (limit {RATE_LIMIT}), {statuses.get(429, 0)} answered 429; "
                        f"B p99 {b_p99 * 1000:.0f} ms, {len(bystood)} sent")
    if abs(rate - RATE_LIMIT) > 0.1 * RATE_LIMIT:
        result.problem(f"A's accepted rate {rate:.1f}/s is not within 10% of the limit {RATE_LIMIT}/s")
    bad = [r for _, _, r in hammered if r.status not in (202, 429)
           or (r.status == 429 and (r.code != "throttled" or not r.headers.get("retry-after")))]
    if bad:
        result.problem(f"{len(bad)} of A's answers neither 202 nor 429 throttled with Retry-After: "
                       f"{checks.histogram(r.short() for r in bad)}")
    if any(r.status != 202 for _, _, r in bystood) or b_p99 > 0.5:
        result.problem(f"B was slowed or refused: {answer_summary([r for _, _, r in bystood])}, p99 {b_p99:.2f}s")
    for tenant, rows in ((hammer, hammered), (bystander, bystood)):
        # only the keys answered 202: an event for a throttled key would be a stray (stored although refused)
        accepted = {key: [reply] for _, key, reply in rows if reply.status == 202}
        ids = check_intake(result, ctx, tenant, accepted, list(accepted))
        check_delivered(result, ctx, tenant, [receiver], ids, profile.settle_seconds, duplicates_allowed=False)
    return result


# ---------------------------------------------------------------- 7. bad input


def fuzz_intake(ctx: Context) -> Result:
    from hypothesis import HealthCheck, Phase, given, seed, settings

    profile = ctx.profile
    stack = ctx.stack
    result = Result("fuzz", load=f"≤{profile.fuzz_examples} hypothesis examples, ≤{profile.fuzz_seconds:.0f}s",
                    faults="random headers, keys, bodies, encodings, sizes")
    tenant = ctx.tenant("fuzz")
    receiver = ctx.receivers.new("fuzz", AlwaysOk())
    ctx.endpoint(tenant, receiver, [])
    nonces = fuzz.Nonces(ctx.run_id)
    records: list[fuzz.FuzzRecord] = []
    deadline = time.monotonic() + profile.fuzz_seconds

    @seed(ctx.seed)
    @settings(max_examples=profile.fuzz_examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(inp=fuzz.fuzz_inputs(tenant.token, INTAKE_MAX_BODY_BYTES))
    def run(inp):
        if time.monotonic() > deadline:
            return
        request_id = f"bbfuzz-{uuid.uuid4().hex}"
        record = fuzz.send("127.0.0.1", stack.web_port, inp, nonces.next(), request_id)
        record.expected = fuzz.expected_outcome(inp, record.key_header, INTAKE_MAX_BODY_BYTES)
        records.append(record)

    run()
    sent = [r for r in records if not r.error.startswith("not sent")]
    result.inputs = len(sent)
    if time.monotonic() > deadline:
        result.notes.append(f"stopped at the {profile.fuzz_seconds:.0f}s budget")
    # verdicts, with the database read in batches
    event_counts = ctx.db.events_by_request_id([r.request_id for r in sent])
    stored = ctx.db.stored_keys(sorted({c for r in sent for c in r.key_candidates if c}))
    failures: dict[str, list[str]] = defaultdict(list)
    accepted_ids = set()
    for r in sent:
        signature = f"{r.inp.body_kind}|ct:{r.inp.content_type}|key:{r.inp.key_kind}|auth:{r.inp.auth_kind}"
        events = event_counts.get(r.request_id, 0)
        keys_here = [stored[c] for c in r.key_candidates if c in stored]
        if r.status is None:
            if r.inp.body_kind.startswith("huge"):
                result.notes.append(f"no answer to an oversized body ({r.error[:60]})")
                continue
            failures[f"no answer: {r.error[:60]}"].append(signature)
            continue
        if r.status >= 500:
            failures[f"{r.status} for {r.inp.body_kind}"].append(signature)
        if r.status >= 400 and not r.answer_type.startswith("application/problem+json") and not (
                r.answered_by_gunicorn and fuzz.odd_header_bytes(r)):
            failures[f"a {r.status} answered as {r.answer_type or 'no content type'}, not problem+json (SPEC §5)"
                     ].append(signature)
        if not fuzz.outcome_matches(r.expected, r):
            failures[f"expected {r.expected}, got {r.status} {r.code}".strip()].append(signature)
        if r.rejected_before_view:
            if keys_here:
                failures[f"key stored for a request rejected before the view ({r.status} {r.code})"].append(signature)
            if events:
                failures[f"event created by a rejected request ({r.status} {r.code})"].append(signature)
        elif 400 <= r.status < 500:
            if events:
                failures[f"event created by a {r.status} answer"].append(signature)
            if r.code in ("idempotency_key_reused", "idempotency_key_in_progress"):
                failures[f"unexpected {r.code} (keys are unique)"].append(signature)
            elif not any(k[1] == r.status for k in keys_here):
                failures[f"the view's {r.status} was not stored with its key (SPEC §3)"].append(signature)
        elif 200 <= r.status < 300:
            if events != 1 and not r.replay:
                failures[f"{r.status} with {events} events for its request"].append(signature)
            if not any(k[1] == r.status for k in keys_here):
                failures[f"{r.status} without its key stored"].append(signature)
            try:
                accepted_ids.add(json.loads(r.body)["id"])
            except (ValueError, KeyError, TypeError):
                failures[f"{r.status} without an event id in its body"].append(signature)
    for text, signatures in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        result.problem(f"{len(signatures)}× {text} (e.g. {Counter(signatures).most_common(1)[0][0]})")
    result.details["statuses"] = dict(Counter(f"{r.status} {r.code}".strip() for r in sent))
    result.details["body_kinds"] = dict(Counter(r.inp.body_kind.split(":")[0] for r in sent))
    result.details["key_kinds"] = dict(Counter(r.inp.key_kind for r in sent))
    result.details["failures"] = {text: dict(Counter(sigs)) for text, sigs in failures.items()}
    result.details["five_xx_examples"] = [
        {"body_kind": r.inp.body_kind, "content_type": r.inp.content_type, "body": r.inp.body[:200].decode("latin-1"),
         "status": r.status} for r in sent if r.status and r.status >= 500][:10]
    result.notes.append(f"{len(accepted_ids)} accepted (202), "
                        f"{sum(1 for r in sent if r.rejected_before_view)} rejected before the view")
    check_delivered(result, ctx, tenant, [receiver], accepted_ids, profile.settle_seconds, duplicates_allowed=False)
    return result


# ---------------------------------------------------------------- 7. soak


def soak(ctx: Context) -> Result:
    profile = ctx.profile
    stack = ctx.stack
    rate, seconds = profile.soak_rate, profile.soak_seconds
    result = Result("soak", load=f"{rate:g} events/s for {seconds:g}s", faults="none (steady load)")
    tenant = ctx.tenant("soak")
    receiver = ctx.receivers.new("soak", AlwaysOk())
    ctx.endpoint(tenant, receiver, ["soak.*"])
    warmup = 3.0
    total = int(rate * (seconds + warmup))
    bodies = _bodies("soak", ctx.run_id, total)
    keys = list(bodies)
    replies: dict[str, list[Reply]] = {}
    lock = threading.Lock()
    backlog: list[int] = []
    stop = threading.Event()

    def job(key: str) -> None:
        got = tenant.api.post_retrying(EVENTS, bodies[key], key, budget=30)
        with lock:
            replies[key] = got

    def sample() -> None:
        for _ in range(int((seconds + warmup) / 2) + 200):  # bounded; normally stopped long before
            backlog.append(ctx.db.backlog(10.0))
            if stop.wait(2.0):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    before = stack.pid_snapshot()
    rss_start: dict[str, float] = {}
    started = time.monotonic()
    with ThreadPoolExecutor(32, thread_name_prefix="soak") as pool:
        sampler.start()
        for i, key in enumerate(keys):
            due = started + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if not rss_start and time.monotonic() - started >= warmup:
                rss_start = stack.rss_snapshot()
            pool.submit(job, key)
        sending = time.monotonic() - started
    rss_end = stack.rss_snapshot()
    stop.set()
    sampler.join(10)
    all_replies = [r for rs in replies.values() for r in rs]
    result.inputs = len(all_replies)
    latencies = [r.elapsed for r in all_replies if r.status == 202]
    result.details["achieved_rate"] = round(len(keys) / max(sending, 0.001), 1)
    result.details["intake_latency_ms"] = {"p50": round(checks.percentile(latencies, 50) * 1000),
                                           "p99": round(checks.percentile(latencies, 99) * 1000),
                                           "max": round(max(latencies, default=0) * 1000)}
    result.details["answers"] = answer_summary(all_replies)
    result.details["backlog_samples"] = backlog
    growth = {name: round(rss_end.get(name, 0) - rss_start.get(name, 0), 1) for name in rss_end}
    result.details["rss_mb_start"] = rss_start
    result.details["rss_mb_end"] = rss_end
    result.details["rss_growth_mb"] = growth
    result.notes.append("RSS growth MB " + ", ".join(f"{k} {v:+.1f}" for k, v in growth.items()))
    result.notes.append(f"intake p50 {result.details['intake_latency_ms']['p50']} ms, "
                        f"p99 {result.details['intake_latency_ms']['p99']} ms; backlog samples {backlog}")
    check_survivors(result, stack, before)
    if checks.backlog_grew(backlog):
        result.problem(f"the backlog (pending, due >10 s ago) grew: {backlog}")
    over = {k: v for k, v in growth.items() if v > profile.rss_limit_mb}
    if over:
        result.problem(f"RSS grew more than {profile.rss_limit_mb:g} MB: {over}")
    event_ids = check_intake(result, ctx, tenant, replies, keys)
    check_delivered(result, ctx, tenant, [receiver], event_ids, profile.settle_seconds, duplicates_allowed=False)
    return result


def _steady_intake(ctx: Context, tenant: Tenant, prefix: str, phase: str, rate: float, seconds: float,
                   until: Callable[[], bool] | None = None) -> tuple[dict[str, list[Reply]], list[float]]:
    """POST `rate` events/s of type `prefix.created` for `seconds` (32 clients, each retrying with its key), or
    until `until()` says stop, if sooner; replies and 202 latencies."""
    keys = [f"{prefix}-{phase}-{ctx.run_id}-{n:05d}" for n in range(int(rate * seconds))]
    bodies = {key: event_body(prefix, key, n) for n, key in enumerate(keys)}
    replies: dict[str, list[Reply]] = {}
    lock = threading.Lock()

    def job(key: str) -> None:
        got = tenant.api.post_retrying(EVENTS, bodies[key], key, budget=30)
        with lock:
            replies[key] = got

    started = time.monotonic()
    with ThreadPoolExecutor(32, thread_name_prefix=f"{prefix}-{phase}") as pool:
        for i, key in enumerate(bodies):
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if until is not None and until():
                break
            pool.submit(job, key)
    latencies = [r.elapsed for rs in replies.values() for r in rs if r.status == 202]
    return replies, latencies


def _history_census(conn: psycopg.Connection, tenant_id: str) -> dict[str, int]:
    """The seeded history of the year scenario (all of its tenant's rows): its events, recent ones, pending
    deliveries, events with one, rows (events + deliveries + attempts) and the events retention must keep."""
    return dict(zip(("events", "recent", "pending", "with_pending", "rows", "must_stay"), conn.execute("""
        SELECT count(*), count(*) FILTER (WHERE created_at > now() - interval '30 days'),
               (SELECT count(*) FROM webhooks_delivery WHERE tenant_id = %(t)s AND status = 'pending'),
               count(*) FILTER (WHERE EXISTS (SELECT 1 FROM webhooks_delivery d WHERE d.event_id = e.id
                                                 AND d.status = 'pending')),
               count(*) + (SELECT count(*) FROM webhooks_delivery WHERE tenant_id = %(t)s)
                        + (SELECT count(*) FROM webhooks_deliveryattempt a JOIN webhooks_delivery d
                               ON d.id = a.delivery_id WHERE d.tenant_id = %(t)s),
               count(*) FILTER (WHERE created_at > now() - interval '30 days'
                                   OR EXISTS (SELECT 1 FROM webhooks_delivery d WHERE d.event_id = e.id
                                                 AND d.status = 'pending'))
          FROM webhooks_event e WHERE e.tenant_id = %(t)s""", {"t": tenant_id}).fetchone()))


def _ulid_time(when: datetime) -> str:
    """The first ten characters of a ULID made at `when` (its 48-bit millisecond time, Crockford base32)."""
    value, chars = int(when.timestamp() * 1000), []
    for _ in range(10):
        chars.append("0123456789ABCDEFGHJKMNPQRSTVWXYZ"[value & 31])
        value >>= 5
    return "".join(reversed(chars))


YEAR_P99_ALLOWANCE_MS = 250.0


def _json_line(line: str) -> dict:
    """A JSON log line as a dict; anything else as {}."""
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def year(ctx: Context) -> Result:
    """A year of history: old events (seeded in SQL, each in its day's partitions), the prune (`manage.py
    prune_events`, what beat runs: whole days dropped, pending events moved on) during steady intake; nothing
    pending or recent may go, and intake p99 may not pass 1.5× its value without the prune."""
    profile = ctx.profile
    n = profile.year_events
    rate = 40.0
    result = Result("year", load=f"{n:,} old events ×4 deliveries ×1 attempt seeded; {rate:g} events/s for "
                                 f"{profile.year_seconds:g}s without, then during, the prune",
                    faults="retention dropping days of millions of rows")
    # the history belongs to a tenant of its own (four endpoints); the load to another
    history = ctx.tenant("year-history")
    archive = ctx.receivers.new("year-history", AlwaysOk())
    for suffix in ("a", "b", "c", "d"):
        ctx.endpoint(history, archive, ["year.old"], suffix=suffix)
    tenant = ctx.tenant("year")
    receiver = ctx.receivers.new("year", AlwaysOk())
    ctx.endpoint(tenant, receiver, ["year.*"])
    started = time.monotonic()
    # Three days of history: 400 and 60 days ago (each one day's partitions, made as an operator would before an
    # import: the days beat makes are the coming ones) and yesterday (recent: it stays). Ids as intake made them
    # on their day; 1 in 1,000 events keeps its deliveries pending (a retry in an hour; a delivery is final within
    # about 28 hours of the default schedule, so this is an outage's worth, ten times bench `year`'s): retention
    # moves those on, and the tables' lock a drop holds grows with them (docs/benchmarks.md, "History").
    today = datetime.now(timezone.utc).date()
    noons = [datetime.combine(today - timedelta(days=ago), datetime.min.time(), tzinfo=timezone.utc)
             + timedelta(hours=12) for ago in (400, 60, 1)]
    for noon in noons[:2]:
        made = subprocess.run([str(VENV_BIN / "python"), "manage.py", "history_partitions", "--from",
                               noon.date().isoformat(), "--to", noon.date().isoformat()], cwd=ROOT,
                              env=ctx.stack.env(), capture_output=True, text=True, timeout=120)
        if made.returncode != 0:
            result.problem(f"history_partitions failed: {made.stderr[-500:]}")
            return result
    with psycopg.connect(ctx.stack.pg.dsn, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO webhooks_event (id, tenant_id, type, channels, payload, request_id, created_at)
            SELECT 'evt_' || (%(heads)s::text[])[x.day] || lpad(x.g::text, 16, '0'), %(tenant)s, 'year.old', '{}',
                   convert_to('{"type":"year.old","timestamp":"2025-01-01T00:00:00.000000Z","data":{"n":' || x.g
                              || '}}', 'UTF8'), '', (%(noons)s::timestamptz[])[x.day]
              FROM (SELECT g, CASE WHEN g > %(n)s * 0.9 THEN 3 WHEN g > %(n)s * 0.45 THEN 2 ELSE 1 END AS day
                      FROM generate_series(1, %(n)s) g) x""",
                     {"tenant": history.tenant_id, "n": n, "heads": [_ulid_time(noon) for noon in noons],
                      "noons": noons})
        conn.execute("""
            INSERT INTO webhooks_delivery (id, tenant_id, event_id, endpoint_id, status, attempt_count,
                                           next_attempt_at, created_at, updated_at)
            SELECT 'dlv_' || substr(e.id, 5) || lpad(ep.rank::text, 5, '0'), %(tenant)s, e.id, ep.id,
                   CASE WHEN right(e.id, 16)::bigint %% 1000 = 0 THEN 'pending' ELSE 'succeeded' END, 1,
                   CASE WHEN right(e.id, 16)::bigint %% 1000 = 0 THEN now() + interval '1 hour' END,
                   e.created_at, e.created_at
              FROM webhooks_event e
             CROSS JOIN (SELECT id, row_number() OVER (ORDER BY id) AS rank FROM webhooks_endpoint
                          WHERE tenant_id = %(tenant)s) ep
             WHERE e.tenant_id = %(tenant)s""", {"tenant": history.tenant_id})
        conn.execute("""
            INSERT INTO webhooks_deliveryattempt (delivery_id, number, started_at, duration_ms, response_status,
                                                  response_body, error, created_at)
            SELECT id, 1, created_at, 10, 200, 'ok', '', created_at FROM webhooks_delivery
             WHERE tenant_id = %(tenant)s""", {"tenant": history.tenant_id})
        conn.execute("""
            INSERT INTO webhooks_deliveryoutbox (delivery_id, due_at, published_at, periodic)
            SELECT id, next_attempt_at, NULL, true FROM webhooks_delivery
             WHERE tenant_id = %(tenant)s AND status = 'pending'""",
                     {"tenant": history.tenant_id})
        conn.execute("VACUUM ANALYZE webhooks_event, webhooks_delivery, webhooks_deliveryattempt")

        before = _history_census(conn, history.tenant_id)
    result.details["seeded"] = {**before, "seconds": round(time.monotonic() - started, 1)}

    quiet_replies, quiet = _steady_intake(ctx, tenant, "year", "quiet", rate, profile.year_seconds)
    # its output (a log line for each partition) to a file: a pipe nobody reads while the load runs could fill
    prune_log = open(LOGS / "prune_events.log", "w+")
    pruner = subprocess.Popen([str(VENV_BIN / "python"), "manage.py", "prune_events"], cwd=ROOT,
                              env={**ctx.stack.env(), "PGAPPNAME": "herald-prune"}, stdout=prune_log,
                              stderr=subprocess.STDOUT, text=True)
    # the command's Python start (a core for a second or so) is not the prune: "during" begins at its first query
    with psycopg.connect(ctx.stack.pg.dsn, autocommit=True) as conn:
        wait_until(lambda: pruner.poll() is not None or conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'herald-prune'").fetchone()[0] > 0,
                   60, 0.05, "prune_events connected to PostgreSQL")
    pruned_at = time.monotonic()
    # the load goes on as long as the prune does (every partition it drops is "during"), and at least as long as
    # the quiet phase
    busy_replies, busy = _steady_intake(
        ctx, tenant, "year", "busy", rate, 600,
        until=lambda: pruner.poll() is not None and time.monotonic() - pruned_at >= profile.year_seconds)
    busy_ended = time.monotonic()
    pruner.wait(timeout=1800)
    prune_log.seek(0)
    output = prune_log.read()
    prune_log.close()
    prune_seconds = time.monotonic() - pruned_at
    if pruner.returncode != 0:
        result.problem(f"prune_events failed: {output[-500:]}")
    with psycopg.connect(ctx.stack.pg.dsn, autocommit=True) as conn:
        after = _history_census(conn, history.tenant_id)
    deleted = before["rows"] - after["rows"]
    result.inputs = len(quiet_replies) + len(busy_replies)
    p99_quiet, p99_busy = checks.percentile(quiet, 99) * 1000, checks.percentile(busy, 99) * 1000
    overlap = prune_seconds >= busy_ended - pruned_at
    result.details.update({
        "prune": output.strip().splitlines()[-1] if output.strip() else "", "prune_seconds": round(prune_seconds, 1),
        "rows_per_second": round(deleted / prune_seconds), "after": after,
        "intake_p99_ms": {"without": round(p99_quiet, 1), "during": round(p99_busy, 1)},
        "prune_outlasted_the_load": overlap,
    })
    drops = [record for record in (_json_line(line) for line in output.splitlines())
             if record.get("message") == "partitions.dropped" and record.get("events")]
    result.details["drops"] = [{key: record.get(key) for key in ("first", "events", "moved_events", "locked_ms")}
                               for record in drops]
    result.notes.append(f"deleted ~{deleted:,} rows in {prune_seconds:.1f} s (~{deleted / prune_seconds:,.0f}/s); "
                        f"intake p99 {p99_quiet:.0f} ms without, {p99_busy:.0f} ms during; "
                        f"{len(drops)} partitions of history dropped, each holding the tables' lock "
                        f"{', '.join(str(record.get('locked_ms')) for record in drops)} ms")
    if after["recent"] != before["recent"]:
        result.problem(f"recent events deleted: {before['recent']} before, {after['recent']} after")
    if after["pending"] != before["pending"] or after["with_pending"] != before["with_pending"]:
        result.problem(f"pending deliveries or their events deleted: {before} -> {after}")
    if after["events"] != before["must_stay"]:
        result.problem(f"{after['events']} seeded events remain, {before['must_stay']} had to: final old ones "
                       f"were left behind")
    # 1.5x, or 250 ms more, whichever is larger: on 2 cores a p99 of a few hundred requests swings from 13 to
    # 131 ms between runs of the same code (the ratio target lives in the bench, as `erasure`'s and `year`'s)
    limit = max(1.5 * max(p99_quiet, 20.0), p99_quiet + YEAR_P99_ALLOWANCE_MS)
    if p99_busy > limit:
        result.problem(f"intake p99 during the prune {p99_busy:.0f} ms > {limit:.0f} ms (1.5 × {p99_quiet:.0f} ms, "
                       f"or {YEAR_P99_ALLOWANCE_MS:.0f} ms more)")
    event_ids = check_intake(result, ctx, tenant, {**quiet_replies, **busy_replies},
                             list(quiet_replies) + list(busy_replies))
    check_delivered(result, ctx, tenant, [receiver], event_ids, profile.settle_seconds, duplicates_allowed=False)
    return result


# Headers a client could use to move the mount point or have the URL rewritten (SPEC §2).
PREFIX_HEADERS = ("SCRIPT_NAME", "Script-Name", "X-Script-Name", "X-Forwarded-Prefix", "X-Original-URL",
                  "X-Rewrite-URL")


def scope(ctx: Context) -> Result:
    """Issue 31's walls, from outside. A tenant's token with `SCRIPT_NAME: /x` and the path /x/api/v1/tenants…
    (gunicorn believed the header from loopback) must not list tenants, mint another tenant's credential, read
    its endpoint's secret or post its events without a key; with each mount/rewrite header and the plain path
    it gets the answer it would get without (never gunicorn's HTML 500). Then a reused uid: the platform posts
    with a key for tenant U, deletes U, creates a new tenant with the same uid and posts again with the same
    key: the new tenant's request executes (no replay of the old tenant's answer); once beat has erased the old
    tenant, none of the platform's stored answers for it is left."""
    stack = ctx.stack
    result = Result("scope", load="a tenant's token against the platform's routes; one uid reused",
                    faults="mount/rewrite headers from the client; a tenant deleted and its uid given again")
    attacker = ctx.tenant("scope-attacker")
    victim = ctx.tenant("scope-victim", via_platform=True)
    receiver = ctx.receivers.new("scope", AlwaysOk())
    endpoint = ctx.endpoint(victim, receiver, ["scope.*"])
    counts_sql = ("SELECT (SELECT count(*) FROM intake_apicredential WHERE tenant_id = %(t)s),"
                  " (SELECT count(*) FROM webhooks_event WHERE tenant_id = %(t)s),"
                  " (SELECT count(*) FROM webhooks_tenant)")
    before = ctx.db.rows(counts_sql, {"t": victim.tenant_id})[0]
    api, mount, target = attacker.api, "/x", f"/api/v1/tenants/{victim.tenant_id}"
    attacks = {
        "list tenants": api.request("GET", mount + "/api/v1/tenants", headers={"SCRIPT_NAME": mount}),
        "mint a credential": api.request("POST", f"{mount}{target}/credentials", body=b"{}",
                                         key=f"scope-{ctx.run_id}-mint", headers={"SCRIPT_NAME": mount}),
        "read a secret": api.request("GET", f"{mount}{target}/endpoints/{endpoint['id']}/secret",
                                     headers={"SCRIPT_NAME": mount}),
        "post an event without a key": api.request(
            "POST", f"{mount}{target}/events", body=json.dumps({"type": "scope.x", "data": {}}).encode(),
            headers={"SCRIPT_NAME": mount}),
    }
    for header in PREFIX_HEADERS:
        value = target if header in ("X-Original-URL", "X-Rewrite-URL") else mount
        attacks[f"{header}, mounted path"] = api.request("GET", f"{mount}{target}", headers={header: value})
        attacks[f"{header}, plain platform path"] = api.request("GET", target, headers={header: value})
    plain = {header: api.request("GET", "/api/v1/endpoints", headers={header: mount}) for header in PREFIX_HEADERS}
    result.inputs = len(attacks) + len(plain)
    for name, reply in attacks.items():
        problem_json = reply.headers.get("content-type", "").startswith("application/problem+json")
        if reply.status not in (400, 403, 404) or not problem_json:
            result.problem(f"{name}: {reply.short()} {reply.body[:120]!r} (expected a 400/403/404 problem)")
    for header, reply in plain.items():
        if reply.status != 200:
            result.problem(f"GET /api/v1/endpoints with {header}: {reply.short()} {reply.body[:120]!r} (expected 200)")
    after = ctx.db.rows(counts_sql, {"t": victim.tenant_id})[0]
    if after != before:
        result.problem(f"the victim's (credentials, events, all tenants) went from {before} to {after}")
    result.details["attacks"] = {name: reply.status for name, reply in attacks.items()}

    # a reused uid gets no replay of the old tenant's answer
    platform = Api(stack.base_url, ctx._platform[0])
    uid, key = f"bb-reused-{ctx.run_id}", f"scope-{ctx.run_id}-reused"
    body = {"type": "scope.reused", "data": {"n": 1}}
    first_tenant = platform.post("/api/v1/tenants", {"name": "reused", "uid": uid}, f"{key}-t1")
    first = platform.post(f"/api/v1/tenants/{uid}/events", body, key)
    deleted = platform.request("DELETE", f"/api/v1/tenants/{uid}")
    second_tenant = platform.post("/api/v1/tenants", {"name": "reused again", "uid": uid}, f"{key}-t2")
    second = platform.post(f"/api/v1/tenants/{uid}/events", body, key)
    result.inputs += 5
    steps = [("create", first_tenant, 201), ("post", first, 202), ("delete", deleted, 202),
             ("create again", second_tenant, 201), ("post again", second, 202)]
    for name, reply, status in steps:
        if reply.status != status:
            result.problem(f"reused uid, {name}: {reply.short()} {reply.body[:160]!r} (expected {status})")
    if second.status == 202 and first.status == 202:
        if second.replay or second.json()["id"] == first.json()["id"]:
            result.problem("the new tenant of a reused uid got the old tenant's stored answer replayed")
        result.notes.append(f"reused uid: first event {first.json()['id']}, the new tenant's {second.json()['id']}")
    if first_tenant.status == 201:
        _erased_with_its_answers(ctx, result, first_tenant.json()["id"])
    return result


def _erased_with_its_answers(ctx: Context, result: Result, tenant_id: str, timeout: float = 120.0) -> None:
    """Once beat's erasure has taken the deleted tenant's row (every TENANT_ERASURE_INTERVAL_SECONDS), none of
    the platform's stored answers for it is left: they held the event's data."""
    def gone() -> bool:
        return not ctx.db.rows("SELECT 1 FROM webhooks_tenant WHERE id = %s", (tenant_id,))

    deadline = time.monotonic() + timeout
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.5)   # beat's erasure runs on its own schedule: a poll of its outcome
    if not gone():
        result.problem(f"the deleted tenant {tenant_id} was not erased within {timeout:.0f} s")
        return
    (left,) = ctx.db.rows("SELECT count(*) FROM intake_idempotencykey WHERE tenant_id = %s", (tenant_id,))[0]
    result.details["stored_answers_after_erasure"] = left
    if left:
        result.problem(f"{left} stored answers of the erased tenant {tenant_id} outlived it")


# ---------------------------------------------------------------- database failover


def database_failover(ctx: Context) -> Result:
    """The primary PostgreSQL dies under steady intake and delivery; pg_auto_failover promotes the synchronous
    secondary. Herald runs on a multi-host DATABASE_URL (target_session_attrs=read-write): every process finds
    the new primary by itself. While the switch lasts the API answers 503 with Retry-After, never 500; it
    serves again within 30 s of the promotion; no accepted event is lost, no key executes twice, no delivery
    is sent twice at the same moment.

    The stack's Herald processes are stopped and started again on the formation for this scenario, then put
    back on the stack's own PostgreSQL."""
    profile, stack = ctx.profile, ctx.stack
    result = Result("database-failover", load=f"{profile.failover_rate:g} events/s for {profile.failover_seconds:g}s, "
                                              "2 workers delivering")
    formation, original, sub = Formation(), stack.pg, None
    for name in list(stack.procs):
        stack.procs.pop(name).stop()
    try:
        formation.start()
        stack.pg = formation
        stack.log(f"database-failover: pg_auto_failover formation up, DATABASE_URL {formation.url}")
        stack.manage("migrate", "--noinput", "-v", "0", timeout=300)
        stack.start_web()
        stack.start_worker()
        stack.start_worker()
        stack.start_beat()
        stack.wait_healthy()
        sub = Context(stack, profile, seed=ctx.seed)
        _failover_run(sub, formation, result)
    finally:
        for name in list(stack.procs):
            stack.procs.pop(name).stop()
        if sub is not None:
            sub.close()
        formation.stop()
        stack.pg = original
        stack.restart_herald("back on the stack's own PostgreSQL after database-failover")
    return result


def _failover_run(ctx: Context, formation: Formation, result: Result) -> None:
    profile, stack = ctx.profile, ctx.stack
    tenant = ctx.tenant("failover")
    receiver = ctx.receivers.new("failover", AlwaysOk())
    ctx.endpoint(tenant, receiver, ["failover.*"])
    pids_before = stack.pid_snapshot()
    got: dict = {}
    load = threading.Thread(target=lambda: got.update(replies=_steady_intake(
        ctx, tenant, "failover", "steady", profile.failover_rate, profile.failover_seconds)[0]), daemon=True)
    started = time.monotonic()
    load.start()
    time.sleep(profile.failover_seconds / 4)  # the load's own pace: a quarter of it before the fault
    old = formation.primary()
    killed_at = formation.kill_postmaster(old)
    stack.log(f"database-failover: SIGKILLed the postmaster of {old}, the primary, "
              f"{killed_at - started:.1f}s into the load")
    new = old
    try:
        wait_until(lambda: (formation.primary() or old) != old, 90, 0.25, "the monitor to promote the secondary")
        new = formation.primary()
    except TimeoutError:
        result.problem("pg_auto_failover did not promote the secondary within 90 s")
    promoted_at = time.monotonic()
    result.faults = f"SIGKILL of the primary's postmaster ({old}); {new} promoted after {promoted_at - killed_at:.1f}s"
    stack.log(f"database-failover: {result.faults}")
    load.join(profile.failover_seconds + 120)
    replies_by_key = got.get("replies", {})
    if load.is_alive() or not replies_by_key:
        result.problem("the intake load did not finish")
    all_replies = [reply for replies in replies_by_key.values() for reply in replies]
    result.inputs = len(all_replies)
    result.details["answers"] = answer_summary(all_replies)
    errors = [r for r in all_replies if r.status == 500]
    if errors:
        result.problem(f"{len(errors)} answers were 500 during the failover, e.g. {errors[0].short()}")
    bare = [r for r in all_replies if r.status == 503 and not r.headers.get("retry-after", "").isdigit()]
    if bare:
        result.problem(f"{len(bare)} answers were 503 without Retry-After, e.g. {bare[0].short()}")
    felt = [r for r in all_replies if r.status is None or r.status >= 500
            or (r.status == 409 and r.code == "idempotency_key_in_progress")]
    last_felt = max((r.sent + r.elapsed for r in felt), default=killed_at)
    result.details["unavailable_answers"] = len(felt)
    result.details["serving_again_after_promotion_seconds"] = round(max(0.0, last_felt - promoted_at), 1)
    result.notes.append(f"clients felt the failover {len(felt)} times (503, no answer or 409 in progress), the last "
                        f"{last_felt - killed_at:.1f}s after the kill, {last_felt - promoted_at:+.1f}s from the "
                        "promotion; each retried with the same key")
    if last_felt - promoted_at > 30:
        result.problem(f"the API still failed {last_felt - promoted_at:.0f}s after the promotion (limit 30 s)")
    event_ids = check_intake(result, ctx, tenant, replies_by_key, list(replies_by_key))
    check_delivered(result, ctx, tenant, [receiver], event_ids, profile.settle_seconds, duplicates_allowed=True)
    check_survivors(result, stack, pids_before)


# ---------------------------------------------------------------- hosts that can be lost


def hosts(ctx: Context) -> Result:
    """Herald on eight test hosts of its own (network namespaces: blackbox/hosts.py): PostgreSQL and Redis each on
    a host, two API hosts, two worker hosts, two beat hosts. Events go to both API hosts while a receiver answers
    after 1 s; a worker host's link is cut while it has attempts in flight, and stays cut; then the broker host's
    link is cut while more events come in, and mended. Nothing accepted may be lost, no key executed twice, no
    webhook sent twice at the same moment, and the other worker must send what the lost one held within SPEC
    §6's bound (2 × WEBHOOK_TIMEOUT_SECONDS + 30 s; its lease is WEBHOOK_LEASE_SECONDS)."""
    result = Result("hosts", load=f"{ctx.profile.hosts_events} events over 2 API hosts, twice; receiver 1 s")
    network = Network()
    stack = HostsStack(network)
    try:
        network.start()
        stack.start()
        ctx.stack.log(f"hosts: {len(stack.procs)} processes on the test hosts of {network.tag}-*")
        token = stack.create_credential(f"bb-hosts-{ctx.run_id}")
        # every request, read and receiver of the scenario from the harness host: nothing leaves the test hosts
        with network.entered("harness"):
            _hosts_run(ctx, network, stack, token, result)
    finally:
        stack.stop()
        network.stop()
    return result


def _leading_beat(db: Db) -> str | None:
    """The host of the beat that holds the leadership lock (config/beat.py), by its session's address."""
    rows = db.rows("SELECT host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                   " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'herald-beat'")
    by_address = {address(host): host for host in ("beat1", "beat2")}
    return by_address.get(rows[0][0]) if rows else None


def _stuck_deliveries(db: Db, tenant_id: str, host: str) -> dict:
    """What holds back the deliveries still pending, and what the lost host's sessions still hold."""
    rows = db.rows(
        "SELECT d.id, d.parked_at IS NOT NULL, d.attempt_count, o.due_at, o.published_at, l.until"
        "  FROM webhooks_delivery d LEFT JOIN webhooks_deliveryoutbox o ON o.delivery_id = d.id"
        "  LEFT JOIN webhooks_deliverylease l ON l.delivery_id = d.id"
        " WHERE d.tenant_id = %s AND d.status = 'pending'", (tenant_id,))
    sessions = db.rows("SELECT pid, state, backend_xid IS NOT NULL, left(query, 120) FROM pg_stat_activity"
                       " WHERE client_addr = %s::inet", (host,))
    return {"pending": [[str(v) for v in row] for row in rows], "lost_host_sessions": [list(map(str, s)) for s in sessions]}


def _hosts_run(ctx: Context, network: Network, stack: HostsStack, token: str, result: Result) -> None:
    n = ctx.profile.hosts_events
    wait_serving([stack.api_url("api1"), stack.api_url("api2")])
    db, receivers = Db(stack.dsn), Receivers()
    try:
        credential_id, tenant_id = db.credential(token)
        apis = [Api(stack.api_url(host), token) for host in ("api1", "api2")]
        tenant = Tenant("hosts", apis[0], token, credential_id, tenant_id)
        receiver = receivers.new("hosts", Slow(1.0), host=address("harness"))
        endpoint = apis[0].create_endpoint(receiver.url, ["hosts.*"], key=f"ep-hosts-{ctx.run_id}", max_in_flight=60)
        receiver.secret = endpoint["secret"]
        view = SimpleNamespace(db=db)
        lost_worker = address("worker1")

        def post(phase: str) -> tuple[list[str], dict[str, list[Reply]], list[Load]]:
            bodies = _bodies(f"hosts.{phase}", ctx.run_id, n)
            keys = list(bodies)
            halves = [dict(list(bodies.items())[i::2]) for i in (0, 1)]
            return keys, bodies, [Load(api, half, clients=8, budget=90, seed=ctx.seed).start()
                                  for api, half in zip(apis, halves)]

        # 1. a worker host cut off mid-attempt
        keys, _, loads = post("a")

        def held_by_lost_worker() -> set[str]:
            return {hit.webhook_id for hit in receiver.snapshot() if hit.finished is None and hit.peer_host == lost_worker}

        try:
            wait_until(held_by_lost_worker, 60, 0.02, "worker1 to have an attempt in flight")
        except TimeoutError:
            result.problem("worker1 never had an attempt in flight within 60 s")
        leader = _leading_beat(db)
        network.cut("worker1")
        cut_at = time.monotonic()
        held = held_by_lost_worker()
        if leader:
            network.cut(leader)  # the beat that leads goes with it: the other must take the lead
        ctx.stack.log(f"hosts: worker1's link cut with {len(held)} attempts in flight, and {leader}'s (leading)")
        replies: dict[str, list[Reply]] = {}
        for load in loads:
            if not load.wait(180):
                result.problem("phase 1's clients still running after 180 s")
            replies.update(load.replies)
        event_ids = check_intake(result, view, tenant, replies, keys)
        check_delivered(result, view, tenant, [receiver], event_ids, ctx.profile.settle_seconds,
                        duplicates_allowed=True)
        if result.problems:
            result.details["stuck"] = _stuck_deliveries(db, tenant_id, lost_worker)
        if leader is None:
            result.problem("no beat held the leadership lock before the cut")
        else:
            try:
                wait_until(lambda: _leading_beat(db) not in (None, leader), 60, 0.5, "the other beat to lead")
                result.details["beat_takeover_seconds"] = round(time.monotonic() - cut_at, 1)
            except TimeoutError:
                result.problem(f"the other beat did not take the lead within 60 s of {leader}'s cut")
        takeover = []
        for webhook_id in held:
            later = [hit.arrived for hit in receiver.snapshot()
                     if hit.webhook_id == webhook_id and hit.arrived > cut_at and hit.peer_host != lost_worker]
            if later:
                takeover.append(min(later) - cut_at)
        bound = 2 * TIMEOUT_SECONDS + 30
        if len(takeover) < len(held):
            result.problem(f"{len(held) - len(takeover)} of the {len(held)} attempts worker1 held were never sent "
                           "again by the other worker")
        if takeover and max(takeover) > bound:
            result.problem(f"the other worker took over after {max(takeover):.1f}s (bound {bound:g}s)")
        result.details["worker_cut"] = {"attempts_held": len(held),
                                        "takeover_max_seconds": round(max(takeover, default=0), 1),
                                        "lease_seconds": float(HERALD_ENV["WEBHOOK_LEASE_SECONDS"])}
        # 2. the broker host cut off while events come in, then back
        network.cut("broker")
        ctx.stack.log("hosts: the broker host's link cut")
        keys_b, _, loads = post("b")
        replies_b: dict[str, list[Reply]] = {}
        for load in loads:
            if not load.wait(180):
                result.problem("phase 2's clients still running after 180 s")
            replies_b.update(load.replies)
        accepted_while_cut = sum(1 for rs in replies_b.values() if rs and rs[-1].status == 202)
        network.mend("broker")
        ctx.stack.log(f"hosts: the broker host's link mended ({accepted_while_cut} events accepted while it was cut)")
        result.faults = (f"worker1's and {leader}'s links cut ({len(held)} attempts in flight; kept cut); then the "
                         f"broker's link cut for {n} events, mended")
        # both phases: the tenant's events are those of phase 1 and phase 2
        all_ids = check_intake(result, view, tenant, {**replies, **replies_b}, keys + keys_b)
        check_delivered(result, view, tenant, [receiver], all_ids, ctx.profile.settle_seconds, duplicates_allowed=True)
        result.inputs = sum(len(rs) for rs in (*replies.values(), *replies_b.values()))
        result.notes.append(f"the other worker sent worker1's {len(held)} held attempts again after "
                            f"{max(takeover, default=0):.1f}s at most; the other beat led after "
                            f"{result.details.get('beat_takeover_seconds', '?')}s; {accepted_while_cut} of {n} events "
                            "accepted while the broker was cut off")
    finally:
        receivers.close()
        db.close()


RUNNERS = {
    "storm": storm,
    "storm-platform": lambda ctx: storm(ctx, via_platform=True),
    "worker-kill": worker_kill,
    "broker-restart": broker_restart,
    "broker-flush": broker_flush,
    "db-restart": db_restart,
    "flapping": flapping,
    "noisy-neighbour": noisy_neighbour,
    "noisy-neighbour-platform": lambda ctx: noisy_neighbour(ctx, via_platform=True),
    "breaker": breaker,
    "slow-clients": slow_clients,
    "front-door": front_door,
    "rate-limit": rate_limit,
    "scope": scope,
    "fuzz": fuzz_intake,
    "year": year,
    "soak": soak,
    "database-failover": database_failover,
    "hosts": hosts,
    "poll-flood": tenant_walls.poll_flood,
    "regex-attack": tenant_walls.regex_attack,
    "fairness": fairness,
}
