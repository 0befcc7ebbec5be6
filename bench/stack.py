"""Processes for a benchmark run: gunicorn, Celery workers, beat and the receiver, on a fresh database."""
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import requests

from testkit import processes
from testkit.processes import free_port  # noqa: F401 - bench/__main__ uses it from here

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LOGS = Path(os.environ.get("BENCH_LOG_DIR") or ROOT / ".data" / "bench")  # each smoke shard has its own
# Another name (and BENCH_REDIS_URL, BENCH_QUEUE) lets two checkouts benchmark on one machine without
# dropping each other's database or purging each other's queue.
DB_NAME = os.environ.get("BENCH_DB_NAME", "herald_bench")


_SECRET_KEY = os.environ.get("SECRET_KEY") or "herald-bench-" + secrets.token_urlsafe(32)


def base_env(**extra) -> dict:
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "DATABASE_URL": f"postgres://127.0.0.1:5432/{DB_NAME}",
        "REDIS_URL": env.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
        "CELERY_BROKER_URL": env.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
        "HERALD_QUEUE": env.get("BENCH_QUEUE", "herald-bench"),
        "DEBUG": "false",
        "SECRET_KEY": _SECRET_KEY,  # with DEBUG off Herald refuses to start without a key of its own
        "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true",
        "LOG_LEVEL": "WARNING",
        "HERALD_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    })
    env.update({k: str(v) for k, v in extra.items()})
    return env


def recreate_database() -> None:
    with psycopg.connect("host=127.0.0.1 dbname=postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB_NAME}")
    subprocess.run([str(BIN / "python"), "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=base_env(), check=True)


class Proc(processes.Process):
    """A process of this run, its output in `.data/bench/<name>.log`."""

    def __init__(self, name: str, argv: list[str], env: dict, ready: str | None = None, cwd: Path = processes.ROOT):
        super().__init__(name, argv, env, LOGS / f"{name}.log", ready=ready, timeout=60, cwd=cwd)


class ActivitySampler:
    """Samples, every 20 ms, what this database's active backends run (the first words of the statement, or the
    function it calls): PostgreSQL's side of a profile, as shares of the samples of backends on CPU or waiting."""

    def __init__(self) -> None:
        self.samples: dict[str, int] = {}
        self.taken = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(f"host=127.0.0.1 dbname={DB_NAME}", autocommit=True) as conn:
            while not self._stop.wait(0.02):
                rows = conn.execute(
                    "SELECT coalesce(substring(query FROM '(herald_[a-z_]+)\\('), left(regexp_replace(query, '\\s+', ' ', 'g'), 40)),"
                    " coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity WHERE state = 'active'"
                    " AND datname = current_database() AND pid <> pg_backend_pid()").fetchall()
                self.taken += 1
                for statement, wait in rows:
                    key = f"{statement} [{wait}]"
                    self.samples[key] = self.samples.get(key, 0) + 1

    def top(self, n: int = 8) -> dict[str, float]:
        """The most sampled statements: on average, how many backends ran each at once."""
        ranked = sorted(self.samples.items(), key=lambda kv: -kv[1])[:n]
        return {key: round(count / max(self.taken, 1), 2) for key, count in ranked}

    def __enter__(self) -> "ActivitySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(5)


class ConnectionSampler:
    """Samples, every 50 ms, how many PostgreSQL connections processes with `application_name` hold."""

    def __init__(self, application_name: str):
        self.application_name = application_name
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(f"host=127.0.0.1 dbname={DB_NAME}", autocommit=True) as conn:
            while not self._stop.wait(0.05):
                (count,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                                        "AND datname = current_database()", [self.application_name]).fetchone()
                self.peak = max(self.peak, count)

    def __enter__(self) -> "ConnectionSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(5)


def gunicorn(port: int, app: str = "config.wsgi", name: str = "gunicorn", cwd: Path = ROOT, args: tuple = (),
             **env) -> Proc:
    """`gunicorn config.wsgi` as the README starts it: only the bind is given, so the repository's
    gunicorn.conf.py sets the workers, for Herald and for the floors alike (`cwd`: another checkout's;
    `args`: flags added, e.g. the Procfile's `--access-logfile -`)."""
    argv = processes.gunicorn_argv(port, app, *args)
    proc = Proc(name, argv, base_env(**env), ready="Booting worker", cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(f"{url}/healthz", timeout=2)
            break
        except (requests.ConnectionError, requests.Timeout):   # not accepting yet, or still loading the app
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    proc.url = url
    return proc


def bare_floor(port: int) -> Proc:
    """The bare intake floor (bench/bare) in a gunicorn of its own, started the same way."""
    with psycopg.connect(f"host=127.0.0.1 dbname={DB_NAME}", autocommit=True) as conn:
        from bench.bare.urls import TABLE_SQL

        conn.execute(TABLE_SQL)
    # Its own settings from the start: gunicorn's master reads the settings (gunicorn.conf.py's start check)
    # before the worker imports bench.bare.wsgi, so setting them there would be too late.
    return gunicorn(port, app="bench.bare.wsgi", name="bare-floor", DJANGO_SETTINGS_MODULE="bench.bare.settings")


def worker(name: str, *flags: str, **env) -> Proc:
    """`celery -A config worker` as the README starts it (the configured pool and concurrency), named;
    `flags` are added (a pool comparison)."""
    if os.environ.get("BENCH_SMOKE"):
        # --smoke measures nothing: a second of mingle (waiting to hear from other workers) per start is saved
        flags = (*flags, "--without-mingle", "--without-gossip")
    argv = processes.celery_worker_argv(name, *flags)
    env = base_env(**env)
    env["LOG_LEVEL"] = "INFO"  # the ready line is logged at INFO
    return Proc(f"worker-{name}", argv, env, ready="ready.")


def beat(**env) -> Proc:
    argv = processes.celery_beat_argv(LOGS / "celerybeat-schedule")
    e = base_env(**env)
    e["LOG_LEVEL"] = "INFO"
    return Proc("beat", argv, e, ready="beat: Starting...")


def otlp_sink(port: int) -> Proc:
    """A stand-in OTLP/HTTP collector that reads and drops what it gets (bench/otlp_sink.py)."""
    proc = Proc("otlp-sink", [str(BIN / "python"), "-m", "bench.otlp_sink", str(port)], base_env(),
                ready="otlp sink ready")
    proc.url = f"http://127.0.0.1:{port}"
    return proc


def receiver(port: int) -> Proc:
    proc = Proc("receiver", [str(BIN / "python"), "-m", "bench.receiver", str(port)], base_env())
    proc.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while True:
        try:
            requests.get(f"{proc.url}/stats", timeout=1)
            return proc
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
