"""Hosts that can be lost, for the `hosts` scenario: Herald on eight test hosts, each a network namespace.

The scenario makes its own hosts (iproute2's `ip netns`), so that a link can be cut as a network would cut
it, without touching anything else on the machine: a switch (a namespace holding a bridge) and one
namespace per host, each joined to the bridge by a veth pair, addresses in a /24 that exists only between
them. Nothing has an address in the machine's own namespace: the harness's receiver and clients live on
a host of their own (`harness`), which the scenario's thread enters (setns) while it runs.

    db 10.213.0.2 (PostgreSQL)        broker 10.213.0.3 (Redis)
    api1 .11, api2 .12 (gunicorn)     worker1 .21, worker2 .22 (Celery)    beat1 .31, beat2 .32
    harness .100 (receivers, clients, the checks' database reads)

Cutting a host sets its port on the bridge down: its packets go nowhere and nothing answers, as when a
machine's network fails (no reset, no FIN: its peers see silence).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from blackbox.stack import DATA, HERALD_ENV, LOGS, VENV_BIN, Proc
from testkit import processes
from testkit.processes import wait_until

SUBNET = "10.213.0"
HOSTS = {"db": 2, "broker": 3, "api1": 11, "api2": 12, "worker1": 21, "worker2": 22, "beat1": 31, "beat2": 32,
         "harness": 100}
WEB_PORT = 8000
DB_NAME = "herald_hosts"
_CLONE_NEWNET = 0x40000000


def address(host: str) -> str:
    return f"{SUBNET}.{HOSTS[host]}"


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


class Network:
    """The switch and the hosts; `ns(host)` is the namespace's name, unique to this run."""

    def __init__(self):
        self.tag = f"hb{os.getpid()}"
        self.made: list[str] = []

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def start(self) -> None:
        if not shutil.which("ip"):
            raise RuntimeError("iproute2 is missing: apt-get install -y iproute2")
        switch = self.ns("switch")
        _ip("netns", "add", switch)
        self.made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for index, host in enumerate(HOSTS):
            name = self.ns(host)
            _ip("netns", "add", name)
            self.made.append(name)
            _ip("link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", f"p{index}", "netns", switch)
            _ip("-n", switch, "link", "set", f"p{index}", "master", "br0", "up")
            _ip("-n", name, "addr", "add", f"{address(host)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")

    def _port(self, host: str) -> str:
        return f"p{list(HOSTS).index(host)}"

    def cut(self, host: str) -> None:
        """The host's link goes down: from now on it neither sends nor receives."""
        _ip("-n", self.ns("switch"), "link", "set", self._port(host), "down")

    def mend(self, host: str) -> None:
        _ip("-n", self.ns("switch"), "link", "set", self._port(host), "up")

    def on(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run on `host`."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    @contextmanager
    def entered(self, host: str):
        """The calling thread (and every thread or process it starts meanwhile) on `host`'s network."""
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.ns(host)}", os.O_RDONLY)
        try:
            if libc.setns(target, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.ns(host)}")
            try:
                yield
            finally:
                if libc.setns(own, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to the machine's own network")
        finally:
            os.close(own)
            os.close(target)

    def stop(self) -> None:
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
        self.made.clear()


class HostsStack:
    """PostgreSQL on `db`, Redis on `broker`, gunicorn on api1 and api2, a Celery worker on worker1 and worker2,
    beat on beat1 and beat2: Herald as a deployment on eight machines would run it."""

    def __init__(self, network: Network):
        self.net = network
        self.dir = DATA / "hosts"
        self.procs: dict[str, Proc] = {}
        self.pg_bin = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parts[-2]))[-1]

    @property
    def database_url(self) -> str:
        return f"postgres://root@{address('db')}:5432/{DB_NAME}"

    @property
    def dsn(self) -> str:
        return f"host={address('db')} port=5432 user=root dbname={DB_NAME} connect_timeout=3"

    def api_url(self, host: str) -> str:
        return f"http://{address(host)}:{WEB_PORT}"

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "WEBHOOK_", "IDEMPOTENCY_"))}
        env.update(HERALD_ENV)
        env.update({
            "DATABASE_URL": self.database_url,
            "REDIS_URL": f"redis://{address('broker')}:6379/0",
            "CELERY_BROKER_URL": f"redis://{address('broker')}:6379/0",
            "ALLOWED_HOSTS": f"{address('api1')},{address('api2')}",
            "WEB_CONCURRENCY": "1",
            "PATH": f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}",
        })
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        return env

    def _start_postgres(self) -> None:
        data = self.dir / "pg"
        data.mkdir(parents=True)
        shutil.chown(data, "postgres", "postgres")
        os.chmod(data, 0o700)
        as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
        subprocess.run([*as_postgres, str(self.pg_bin / "initdb"), "-D", str(data), "-U", "root", "--auth=trust",
                        "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"], cwd="/", check=True, capture_output=True,
                       timeout=120)
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {SUBNET}.0/24 trust\n")
        self.procs["postgres"] = Proc("hosts-postgres", self.net.on("db", [
            *as_postgres, str(self.pg_bin / "postgres"), "-D", str(data), "-c", f"listen_addresses={address('db')}",
            "-c", "unix_socket_directories=", "-c", "fsync=off", "-c", "max_connections=200"]), dict(os.environ),
            ready="ready to accept connections", timeout=60)
        self.run("api1", ["psql", "-X", "-q", "-h", address("db"), "-U", "root", "-d", "postgres",
                          "-c", f"CREATE DATABASE {DB_NAME}"])

    def run(self, host: str, argv: list[str], timeout: float = 300) -> str:
        out = subprocess.run(self.net.on(host, argv), cwd=processes.ROOT, env=self.env(), capture_output=True,
                             text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} on {host} failed:\n{out.stderr[-3000:]}")
        return out.stdout

    def manage(self, *args: str) -> str:
        return self.run("api1", [str(VENV_BIN / "python"), "manage.py", *args])

    def start(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        LOGS.mkdir(parents=True, exist_ok=True)
        self._start_postgres()
        self.procs["redis"] = Proc("hosts-redis", self.net.on("broker", [
            shutil.which("redis-server") or "/usr/bin/redis-server", "--bind", address("broker"), "--port", "6379",
            "--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", str(self.dir)]),
            dict(os.environ), ready="Ready to accept connections", timeout=30)
        self.manage("migrate", "--noinput", "-v", "0")
        for host in ("api1", "api2"):
            argv = [str(VENV_BIN / "gunicorn"), "config.wsgi", "--bind", f"{address(host)}:{WEB_PORT}"]
            self.procs[host] = Proc(f"hosts-{host}", self.net.on(host, argv), self.env(), ready="Booting worker",
                                    timeout=90)
        for host in ("worker1", "worker2"):
            self.procs[host] = Proc(f"hosts-{host}", self.net.on(host, processes.celery_worker_argv(host)), self.env(),
                                    ready="ready.", timeout=90)
        for host in ("beat1", "beat2"):
            schedule = self.dir / f"{host}-schedule"
            self.procs[host] = Proc(f"hosts-{host}", self.net.on(host, processes.celery_beat_argv(schedule)),
                                    self.env(), ready="beat: Starting...", timeout=90)

    def create_credential(self, tenant: str) -> str:
        return self.manage("create_credential", "--tenant", tenant).strip().splitlines()[-1].strip()

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            self.procs.pop(name).stop()


def wait_serving(urls: list[str], timeout: float = 60) -> None:
    """Every API host answers /healthz 200 (called from the harness host)."""
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def healthy(url: str) -> bool:
        try:
            with opener.open(f"{url}/healthz", timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    for url in urls:
        wait_until(lambda u=url: healthy(u), timeout, 0.25, f"{url}/healthz 200")
