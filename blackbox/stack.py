"""Herald's whole stack as real processes on 127.0.0.1: its own PostgreSQL and Redis, gunicorn, Celery, beat."""
from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from testkit import processes
from testkit.processes import free_port, wait_until  # noqa: F401 - the scenarios use them from here

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".data" / "blackbox"
LOGS = DATA / "logs"
VENV_BIN = ROOT / ".venv" / "bin"
DB_NAME = "herald_blackbox"

# The short schedule and timings of the brief; exported to every Herald process.
HERALD_ENV = {
    "DJANGO_SETTINGS_MODULE": "config.settings",
    "DEBUG": "false",
    # a key of this run's own (with DEBUG off Herald refuses to start without one); every process shares it
    "SECRET_KEY": os.environ.get("SECRET_KEY") or "herald-blackbox-" + secrets.token_urlsafe(32),
    "WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true",  # the receivers live on 127.0.0.1
    "WEBHOOK_RETRY_SCHEDULE": "1,1,2",
    "WEBHOOK_RETRY_JITTER": "0.1",
    "WEBHOOK_TIMEOUT_SECONDS": "2",
    "WEBHOOK_LEASE_SECONDS": "5",
    "WEBHOOK_DISPATCH_INTERVAL_SECONDS": "0.5",
    "WEBHOOK_REDISPATCH_AFTER_SECONDS": "3",
    # the breaker's pauses compressed like the schedule (SPEC: 30 s doubling to 600 s)
    "WEBHOOK_BREAKER_COOLDOWN_SECONDS": "1",
    "WEBHOOK_BREAKER_COOLDOWN_MAX_SECONDS": "4",
    "HERALD_QUEUE": "blackbox",
    "PYTHONUNBUFFERED": "1",
}
RETRY_SCHEDULE = tuple(int(s) for s in HERALD_ENV["WEBHOOK_RETRY_SCHEDULE"].split(","))
TIMEOUT_SECONDS = float(HERALD_ENV["WEBHOOK_TIMEOUT_SECONDS"])
INTAKE_MAX_BODY_BYTES = 262144  # Herald's default, not overridden here


def socket_owners(local_ports: set[int]) -> dict[int, int]:
    """Map TCP ports on 127.0.0.1 (the local side of client sockets) to the pid holding them."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            port = int(parts[1].rsplit(":", 1)[1], 16)
            if port in local_ports:
                inodes[parts[9]] = port
    owners: dict[int, int] = {}
    if not inodes:
        return owners
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                port = inodes.get(target[8:-1])
                if port is not None:
                    owners[port] = int(entry)
    return owners


# ---------------------------------------------------------------- one Herald process

class Proc(processes.Process):
    """A process of this run, its output appended to `.data/blackbox/logs/<name>.log` (a restart adds to it)."""

    def __init__(self, name: str, argv: list[str], env: dict, ready: str | None = None, timeout: float = 60):
        super().__init__(name, argv, env, LOGS / f"{name}.log", ready=ready, timeout=timeout, append=True)


def install_signal_handlers() -> None:
    """SIGTERM/SIGHUP become SystemExit so that try/finally and atexit run; SIGINT is KeyboardInterrupt."""
    def _exit(signum, frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)


# ---------------------------------------------------------------- PostgreSQL

def _as_postgres(command: list[str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command as the `postgres` OS user (initdb and the server refuse root).

    Output goes to a file, never a pipe: a postmaster started by pg_ctl inherits it and would hold it open.
    """
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / "pg_ctl.log", "ab") as out:
        out.write(f"\n$ {shlex.join(command)}\n".encode())
        out.flush()
        completed = subprocess.run(["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(command)], cwd="/",
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    if check and completed.returncode != 0:
        raise RuntimeError(f"{command[0]} failed with {completed.returncode}; see {LOGS / 'pg_ctl.log'}")
    return completed


class Postgres:
    """A private cluster under .data/blackbox/pg, trust auth for `root`, restartable."""

    def __init__(self):
        self.dir = DATA / "pg"
        self.log = LOGS / "postgres.log"
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
        if not bins:
            raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin")
        self.bin = bins[-1]
        self.port = 0
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"postgres://root@127.0.0.1:{self.port}/{DB_NAME}"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=root dbname={DB_NAME} connect_timeout=5"

    def _ctl(self, *args: str, timeout: float = 90, check: bool = True) -> subprocess.CompletedProcess:
        return _as_postgres([f"{self.bin}/pg_ctl", "-D", str(self.dir), *args], timeout=timeout, check=check)

    def start(self) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        if (self.dir / "postmaster.pid").exists():  # a cluster left running by an interrupted run of ours
            self._ctl("stop", "-m", "immediate", "-w", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        shutil.chown(self.dir, "postgres", "postgres")
        os.chmod(self.dir, 0o700)
        self.log.touch()
        shutil.chown(self.log, "postgres", "postgres")
        _as_postgres([f"{self.bin}/initdb", "-D", str(self.dir), "-U", "root", "--auth=trust", "-E", "UTF8",
                      "--locale=C.UTF-8", "--no-sync"])
        self.port = free_port()
        # fsync off: restarts here are clean (`-m fast` checkpoints), and the machine is shared
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k /tmp -c max_connections=200 "
                   f"-c fsync=off -c full_page_writes=off")
        self._ctl("-l", str(self.log), "-o", options, "start", "-w", "-t", "60")
        processes.at_exit(self.stop)
        self._wait_ready()
        subprocess.run(["psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", "root", "-d", "postgres",
                        "-c", f"CREATE DATABASE {DB_NAME}"], check=True, capture_output=True, timeout=60)

    def _wait_ready(self, timeout: float = 60) -> None:
        wait_until(lambda: subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                                          timeout=10).returncode == 0, timeout, 0.2, "PostgreSQL to accept connections")

    def restart(self) -> float:
        """`pg_ctl restart -m fast`: every connection is cut; returns the seconds it was unavailable."""
        started = time.monotonic()
        self._ctl("-l", str(self.log), "restart", "-m", "fast", "-w", "-t", "60")
        self._wait_ready()
        self.restarts += 1
        return time.monotonic() - started

    def stop(self) -> None:
        if self.port and (self.dir / "postmaster.pid").exists():
            self._ctl("stop", "-m", "fast", "-w", "-t", "30", check=False)


# ---------------------------------------------------------------- Redis

class Redis:
    """A private redis-server without persistence on a fixed port, which can be crashed and started again."""

    def __init__(self):
        self.port = free_port()
        self.dir = DATA / "redis"
        self.proc: Proc | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        argv = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
                "--dir", str(self.dir)]
        self.proc = Proc("redis", argv, dict(os.environ), ready="Ready to accept connections", timeout=30)

    def stop(self) -> None:
        if self.proc:
            self.proc.kill()
            self.proc.stop()
            self.proc = None

    def restart(self, down_seconds: float = 2.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()
        self.restarts += 1

    def command(self, *args: str) -> str:
        out = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip()

    def flushall(self) -> str:
        return self.command("FLUSHALL")

    def queued_tasks(self) -> list[tuple[str, str | list]]:
        """(task name, first argument) of every Celery message waiting in any queue (Celery's JSON protocol 2)."""
        import redis  # Herald's own dependency, in .venv; here only to read the harness's private Redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        raw_messages = []
        try:
            for name in client.scan_iter(count=1000):
                if name.startswith((b"_", b"unacked")) or client.type(name) != b"list":
                    continue
                raw_messages += client.lrange(name, 0, -1)
        except redis.RedisError:
            return []
        finally:
            client.close()
        out = []
        for raw in raw_messages:
            try:
                message = json.loads(raw)
                args = json.loads(base64.b64decode(message["body"]))[0]
                first = args[0] if args else ""
                out.append((message["headers"]["task"], first if isinstance(first, list) else str(first)))
            except (ValueError, KeyError, TypeError, IndexError):
                out.append(("?", ""))
        return out


class RabbitMQ:
    """The machine's RabbitMQ (scripts/services starts it when CELERY_BROKER_URL is amqp) with a virtual host of
    this run's own: restarted with `rabbitmqctl stop_app` / `start_app` (durable queues and persistent messages
    survive it) and purged queue by queue (nothing survives that)."""

    name = "rabbitmq"

    def __init__(self, host: str = "127.0.0.1", port: int = 5672):
        self.host, self.port = host, port
        self.vhost = f"herald-blackbox-{os.getpid()}"
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/{self.vhost}"

    def ctl(self, *args: str, timeout: float = 60) -> str:
        out = subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {out.stderr.strip()[-500:]}")
        return out.stdout

    def version(self) -> str:
        for line in self.ctl("status").splitlines():
            if line.startswith("RabbitMQ version:"):
                return line.split(":", 1)[1].strip()
        return "?"

    def start(self) -> None:
        self.ctl("add_vhost", self.vhost)
        self.ctl("set_permissions", "-p", self.vhost, "guest", ".*", ".*", ".*")

    def stop(self) -> None:
        try:
            self.ctl("delete_vhost", self.vhost)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass

    def _reachable(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def restart(self, down_seconds: float = 4.0) -> None:
        self.ctl("stop_app")
        time.sleep(down_seconds)
        self.ctl("start_app")
        wait_until(self._reachable, 60, 0.2, "RabbitMQ to accept connections again")
        self.restarts += 1

    def queues(self) -> dict[str, int]:
        """Messages waiting in each queue of the run's virtual host."""
        out = self.ctl("list_queues", "-p", self.vhost, "name", "messages", "--quiet", "--no-table-headers")
        queues = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                queues[parts[0]] = int(parts[1])
        return queues

    def purge(self) -> str:
        queues = self.queues()
        for name in queues:
            self.ctl("purge_queue", "-p", self.vhost, name)
        return f"purged {len(queues)} queues ({sum(queues.values())} messages)"


# ---------------------------------------------------------------- the whole stack

@dataclass
class Stack:
    """PostgreSQL, Redis, gunicorn (as gunicorn.conf.py sets it), two Celery workers as the README starts them
    (threads, WEBHOOK_WORKER_CONCURRENCY each) and beat."""

    pg: Postgres = field(default_factory=Postgres)
    redis: Redis = field(default_factory=Redis)
    # the Celery broker when not Redis (`--broker rabbitmq`); Redis still serves the doorbell and the rate limit
    rabbitmq: RabbitMQ | None = None
    web_port: int = 0
    procs: dict[str, Proc] = field(default_factory=dict)
    worker_serial: int = 0
    events: list[str] = field(default_factory=list)  # what was done to the stack, for the report

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def broker(self) -> str:
        return "rabbitmq" if self.rabbitmq else "redis"

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "WEBHOOK_", "IDEMPOTENCY_"))}
        env.update(HERALD_ENV)
        env.update({
            "DATABASE_URL": self.pg.url,
            "REDIS_URL": self.redis.url,
            "CELERY_BROKER_URL": self.rabbitmq.url if self.rabbitmq else self.redis.url,
            "PROMETHEUS_MULTIPROC_DIR": str(DATA / "metrics"),
            "PATH": f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}",
        })
        return env

    def log(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        self.events.append(line)
        with open(LOGS / "harness.log", "a") as f:
            f.write(line + "\n")

    # -- lifecycle

    def start(self) -> None:
        shutil.rmtree(LOGS, ignore_errors=True)
        LOGS.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(DATA / "metrics", ignore_errors=True)
        (DATA / "metrics").mkdir(parents=True)
        self.pg.start()
        self.log(f"postgres up on 127.0.0.1:{self.pg.port} ({self.pg.dir})")
        self.redis.start()
        self.log(f"redis up on 127.0.0.1:{self.redis.port}")
        if self.rabbitmq:
            self.rabbitmq.start()
            self.log(f"rabbitmq {self.rabbitmq.version()}: virtual host {self.rabbitmq.vhost} is the broker")
        self.manage("migrate", "--noinput", "-v", "0", timeout=300)
        self.start_web()
        self.start_worker()
        self.start_worker()
        self.start_beat()
        self.wait_healthy()

    def manage(self, *args: str, timeout: float = 120) -> str:
        out = subprocess.run([str(VENV_BIN / "python"), "manage.py", *args], cwd=ROOT, env=self.env(),
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{out.stderr[-3000:]}")
        return out.stdout

    def create_credential(self, tenant: str) -> str:
        """`manage.py create_credential --tenant NAME`; the token is the last stdout line."""
        return self.manage("create_credential", "--tenant", tenant).strip().splitlines()[-1].strip()

    def start_web(self, **env) -> Proc:
        """`gunicorn config.wsgi` as the README starts it: the repository's gunicorn.conf.py sets the workers (two
        by default); `env` overrides settings (for one scenario)."""
        self.web_port = self.web_port or free_port()
        argv = processes.gunicorn_argv(self.web_port)
        proc = self.procs["web"] = Proc("gunicorn", argv, {**self.env(), **env}, ready="Booting worker", timeout=90)
        wait_until(lambda: len(proc.pids()) >= 3, 60, 0.2, "two gunicorn workers")
        return proc

    def restart_web(self, reason: str, **env) -> None:
        """Stop gunicorn and start it again on the same port with `env` (none: the suite's own settings)."""
        self.log(f"restarting gunicorn: {reason}")
        self.procs.pop("web").stop()
        self.start_web(**env)
        self.wait_healthy()

    def start_worker(self, **env) -> Proc:
        """`celery -A config worker` as the README starts it; `env` overrides settings (for one scenario)."""
        self.worker_serial += 1
        name = f"w{self.worker_serial}"
        argv = processes.celery_worker_argv(name)
        proc = self.procs[name] = Proc(f"worker-{name}", argv, {**self.env(), **env}, ready="ready.", timeout=90)
        return proc

    def stop_workers(self) -> None:
        for name in list(self.workers()):
            self.procs.pop(name).stop()

    def start_beat(self) -> Proc:
        schedule = DATA / "beat-schedule"
        for stale in DATA.glob("beat-schedule*"):
            stale.unlink()
        argv = processes.celery_beat_argv(schedule)
        proc = self.procs["beat"] = Proc("beat", argv, self.env(), ready="beat: Starting...", timeout=90)
        return proc

    def workers(self) -> dict[str, Proc]:
        return {name: proc for name, proc in self.procs.items() if name.startswith("w") and name != "web"}

    def herald_procs(self) -> dict[str, Proc]:
        return dict(self.procs)

    def pid_snapshot(self) -> dict[str, list[int]]:
        return {name: proc.pids() for name, proc in self.procs.items()}

    def rss_snapshot(self) -> dict[str, float]:
        return {name: round(proc.rss_mb(), 1) for name, proc in self.procs.items()}

    def health(self) -> tuple[int, dict]:
        try:
            with _LOCAL_OPENER.open(f"{self.base_url}/healthz", timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read())
            except ValueError:
                return exc.code, {}
        except OSError as exc:
            return 0, {"error": repr(exc)}

    def wait_healthy(self, timeout: float = 60) -> None:
        wait_until(lambda: self.health()[0] == 200, timeout, 0.25, "/healthz 200")

    def restart_herald(self, reason: str) -> None:
        """Stop and start gunicorn, the workers and beat (used only to heal the stack between scenarios)."""
        self.log(f"restarting every Herald process: {reason}")
        for name in list(self.procs):
            self.procs.pop(name).stop()
        self.start_web()
        self.start_worker()
        self.start_worker()
        self.start_beat()
        self.wait_healthy()

    def stop(self) -> None:
        for name in list(self.procs):
            self.procs.pop(name).stop()
        self.redis.stop()
        if self.rabbitmq:
            self.rabbitmq.stop()
        self.pg.stop()
        processes.stop_all()


# Never a proxy: every request of the harness goes straight to 127.0.0.1.
_LOCAL_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
