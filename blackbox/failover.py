"""A PostgreSQL that fails over, for the `database-failover` scenario: pg_auto_failover on this machine.

A monitor, a primary and a synchronous secondary (Debian's `postgresql-15-auto-failover`), each a cluster
with its own port and data directory under .data/blackbox/failover, each kept by its own `pg_autoctl run`.
Herald reaches it through a multi-host DATABASE_URL (`target_session_attrs=read-write`), as a deployment
would (docs/operations.md, "A PostgreSQL that fails over"). It stands where the stack's Postgres does: the
same `url`, `dsn`, `port`, `start()` and `stop()`.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from blackbox.stack import DATA, DB_NAME, LOGS, Proc
from testkit.processes import free_port, wait_until

PG_AUTOCTL = shutil.which("pg_autoctl") or "/usr/bin/pg_autoctl"
INSTALL = "apt-get install -y --no-install-recommends postgresql-15-auto-failover"


def _pg_ctl() -> str:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin")
    return str(found[-1])


class Formation:
    """pg_auto_failover's monitor and two data nodes, run as the `postgres` OS user (its servers refuse root)."""

    def __init__(self):
        self.dir = DATA / "failover"
        self.monitor_port = 0
        self.ports: list[int] = []
        self.keepers: dict[str, Proc] = {}

    # -- what the stack reads

    @property
    def port(self) -> str:
        return ",".join(str(port) for port in self.ports)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"postgres://root@{hosts}/{DB_NAME}?target_session_attrs=read-write"

    @property
    def dsn(self) -> str:
        return (f"host={','.join('127.0.0.1' for _ in self.ports)} port={self.port} user=root dbname={DB_NAME} "
                "target_session_attrs=read-write connect_timeout=3")

    # -- lifecycle

    def _env(self) -> dict:
        # UTF-8: initdb takes its encoding from the locale, and a C locale would make SQL_ASCII databases
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir), "LC_ALL": "C.UTF-8",
                "XDG_CONFIG_HOME": str(self.dir / "config"), "XDG_DATA_HOME": str(self.dir / "share"),
                "PG_CONFIG": str(Path(_pg_ctl()).parent / "pg_config")}

    def _as_postgres(self, *args: str) -> list[str]:
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *args]

    def _autoctl(self, *args: str, timeout: float = 120) -> str:
        out = subprocess.run(self._as_postgres(PG_AUTOCTL, *args), env=self._env(), cwd="/", capture_output=True,
                             text=True, timeout=timeout)
        with open(LOGS / "pg_autoctl.log", "a") as log:
            log.write(f"\n$ pg_autoctl {' '.join(args)}\n{out.stdout}{out.stderr}")
        if out.returncode != 0:
            raise RuntimeError(f"pg_autoctl {args[0]} {args[1] if len(args) > 1 else ''} failed "
                               f"({out.returncode}); see {LOGS / 'pg_autoctl.log'}")
        return out.stdout

    def _run(self, name: str) -> None:
        self.keepers[name] = Proc(f"pg_autoctl-{name}", self._as_postgres(
            PG_AUTOCTL, "run", "--pgdata", str(self.dir / name)), self._env())

    def start(self) -> None:
        if not Path(PG_AUTOCTL).exists():
            raise RuntimeError(f"pg_auto_failover is missing: {INSTALL} (scripts/test-deps does)")
        LOGS.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        shutil.chown(self.dir, "postgres", "postgres")
        common = ("--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--pgctl", _pg_ctl())
        self.monitor_port = free_port()
        self._autoctl("create", "monitor", "--pgdata", str(self.dir / "monitor"),
                      "--pgport", str(self.monitor_port), *common)
        self._run("monitor")
        monitor = f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover?sslmode=disable"
        wait_until(lambda: self._state_or_none() is not None, 60, 0.5, "the pg_auto_failover monitor")
        for index, name in enumerate(("node1", "node2")):
            port = free_port()
            self.ports.append(port)
            self._autoctl("create", "postgres", "--pgdata", str(self.dir / name), "--pgport", str(port),
                          "--name", name, "--dbname", DB_NAME, "--monitor", monitor, *common, timeout=180)
            self._run(name)
            wanted = "single" if index == 0 else "secondary"
            wait_until(lambda n=name, w=wanted: self.reported(n) == w, 120, 0.5, f"{name} to be {wanted}")
        wait_until(lambda: self.reported("node1") == "primary", 60, 0.5, "node1 to be primary")
        # Herald and the harness connect as `root`, as to the stack's own cluster
        subprocess.run(["psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(self.ports[0]), "-U", "postgres",
                        "-d", DB_NAME, "-c", "CREATE ROLE root SUPERUSER LOGIN"], check=True, capture_output=True,
                       timeout=60)

    def stop(self) -> None:
        for name in ("node2", "node1", "monitor"):
            keeper = self.keepers.pop(name, None)
            if keeper is not None:
                keeper.stop(grace=30)  # pg_autoctl stops its PostgreSQL on SIGTERM

    # -- state and faults

    def _state_or_none(self) -> list[dict] | None:
        try:
            out = self._autoctl("show", "state", "--pgdata", str(self.dir / "monitor"), "--json", timeout=30)
            return json.loads(out)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired):
            return None

    def reported(self, name: str) -> str | None:
        for node in self._state_or_none() or []:
            if node.get("nodename", node.get("node_name")) == name:
                return node.get("reported_state", node.get("current_group_state"))
        return None

    def primary(self) -> str | None:
        """The node the monitor reports as primary (or wait_primary: serving writes alone)."""
        for name in ("node1", "node2"):
            if self.reported(name) in ("primary", "wait_primary"):
                return name
        return None

    def postmaster_pid(self, name: str) -> int:
        return int((self.dir / name / "postmaster.pid").read_text().split()[0])

    def kill_postmaster(self, name: str) -> float:
        """SIGKILL the node's postmaster (its keeper, pg_autoctl, lives on); returns the monotonic time."""
        pid = self.postmaster_pid(name)
        os.kill(pid, 9)
        return time.monotonic()
