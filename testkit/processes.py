"""One supervisor for the real processes that tests, benchmarks and the black-box suite start.

Each of them (tests/processes.py, bench/stack.py, blackbox/stack.py) says where its logs go and what
environment its processes get; how a process is started, watched, measured and stopped lives here once,
and so do Herald's three command lines as the README runs them.
"""
from __future__ import annotations

import atexit
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll `predicate` until truthy (return its value) or raise TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------- Herald's command lines, as the README runs them

def gunicorn_argv(port: int, app: str = "config.wsgi", *args: str) -> list[str]:
    """`gunicorn config.wsgi` with only a bind: the repository's gunicorn.conf.py sets the rest."""
    return [str(BIN / "gunicorn"), app, "--bind", f"127.0.0.1:{port}", *args]


def celery_worker_argv(name: str, *flags: str) -> list[str]:
    """`celery -A config worker`, named `name@host`, at INFO (its ready line is logged at INFO)."""
    return [str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--hostname", f"{name}@%h", *flags]


def celery_beat_argv(schedule: Path, loglevel: str = "INFO") -> list[str]:
    """`celery -A config beat`, its schedule file at `schedule`."""
    return [str(BIN / "celery"), "-A", "config", "beat", "--loglevel", loglevel, "--schedule", str(schedule)]


# ---------------------------------------------------------------- process groups and /proc

def group_pids(pgid: int) -> list[int]:
    """Every live pid whose process group is `pgid` (read from /proc/PID/stat)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # the command may contain spaces and parentheses: split after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry))
    return sorted(pids)


def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kb(pid: int) -> int:
    return _status_kb(pid, "VmRSS:")


# ---------------------------------------------------------------- one process

class Process:
    """A subprocess leading its own process group, its output in `log_path`, always stopped at the end:
    by `stop()`, or at the latest when the Python process exits (every live one is SIGKILLed then)."""

    stop_signal = signal.SIGTERM  # what `stop()` sends first: the program's graceful shutdown

    def __init__(self, name: str, argv: list[str], env: dict, log_path: Path, ready: str | None = None,
                 timeout: float = 30, append: bool = False, cwd: Path = ROOT):
        self.name = name
        self.argv = argv
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab" if append else "wb")
        if append:
            self._log.write(f"\n==== {time.strftime('%H:%M:%S')} start {shlex.join(argv)}\n".encode())
            self._log.flush()
        self._start_offset = self._log.tell()
        self.popen = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        self.pgid = self.popen.pid
        _registry.add(self)
        if ready:
            try:
                self.wait_for_output(ready, timeout)
            except BaseException:
                self.stop()  # never leave a half-started process consuming a queue
                raise

    def output(self) -> str:
        """What the process has written since it started."""
        with open(self.log_path, "rb") as f:
            f.seek(self._start_offset)
            return f.read().decode(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited early (rc {self.popen.returncode}); "
                                   f"log {self.log_path}:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout}s; log {self.log_path}:\n"
                                   f"{self.output()[-3000:]}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def pids(self) -> list[int]:
        """The process and its children (gunicorn workers, Celery pool processes)."""
        return group_pids(self.pgid)

    def cpu_seconds(self) -> float:
        """User and system CPU the process and its children have used so far."""
        total = 0.0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def rss_mb(self) -> float:
        return sum(rss_kb(pid) for pid in self.pids()) / 1024

    def peak_rss_mb(self) -> dict[int, float]:
        return {pid: _status_kb(pid, "VmHWM:") / 1024 for pid in self.pids()}

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, with no chance to clean up or requeue."""
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self, grace: float = 10, sig: signal.Signals | None = None) -> None:
        """Send the group `sig` (else `stop_signal`, SIGTERM) and wait up to `grace` seconds; then SIGKILL what
        is left of it (children of a leader that exited: a prefork pool, gunicorn workers)."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.pgid, sig or self.stop_signal)
                self.popen.wait(grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.kill()
        _registry.discard(self)
        if not self._log.closed:
            self._log.close()


class _Registry:
    """Every process started and not yet stopped, so that an exit of any kind stops them all."""

    def __init__(self):
        self._lock = threading.Lock()
        self.processes: list[Process] = []
        self.cleanups: list = []

    def add(self, process: Process) -> None:
        with self._lock:
            self.processes.append(process)

    def discard(self, process: Process) -> None:
        with self._lock:
            if process in self.processes:
                self.processes.remove(process)

    def stop_all(self) -> None:
        with self._lock:
            processes, self.processes = list(self.processes), []
            cleanups, self.cleanups = list(self.cleanups), []
        for process in reversed(processes):
            try:
                os.killpg(process.pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for cleanup in reversed(cleanups):
            try:
                cleanup()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass


_registry = _Registry()
atexit.register(_registry.stop_all)


def at_exit(cleanup) -> None:
    """Run `cleanup` when the Python process exits, after every live process has been killed."""
    _registry.cleanups.append(cleanup)


def stop_all() -> None:
    _registry.stop_all()
