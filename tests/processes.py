"""Real Herald processes for tests: Celery workers and beat, gunicorn, a private redis-server, Prometheus."""
import os
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# Every process's output and scratch files: emptied when a test session starts (tests/conftest.py), kept
# after it for a look at what failed, never left in the machine's temp dir.
RUN_DIR = ROOT / "tests" / "artifacts" / "run"


def run_dir(name: str) -> Path:
    """A new directory under RUN_DIR."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=RUN_DIR))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Process:
    """A subprocess in its own process group, its output in a log file, stopped for sure at the end."""

    def __init__(self, name: str, argv: list[str], env: dict, ready: str | None = None, timeout: float = 30):
        self.name = name
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log", dir=RUN_DIR)[1])
        self._log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        if ready:
            try:
                self.wait_for_output(ready, timeout)
            except BaseException:
                self.stop()  # never leave a half-started process consuming the test queue
                raise

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.output()[-3000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, with no chance to clean up or requeue."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.kill()
        self._log.close()


def celery_worker(name: str = "w1", concurrency: int | None = 1, pool: str | None = None, **env) -> Process:
    """`celery -A config worker` as the README runs it (threads, WEBHOOK_WORKER_CONCURRENCY), unless the
    test asks for another `concurrency` (None: the configured one) or `pool`."""
    argv = [str(BIN / "celery"), "-A", "config", "worker", "--loglevel", "INFO", "--hostname", f"{name}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat"]
    if pool:
        argv += ["--pool", pool]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    return Process(f"worker-{name}", argv, subprocess_env(**env), ready="ready.")


def celery_beat(loglevel: str = "INFO", **env) -> Process:
    """`celery -A config beat`; with `loglevel="DEBUG"` its dispatcher ticks show (they log at DEBUG)."""
    schedule = run_dir("beat") / "schedule"
    argv = [str(BIN / "celery"), "-A", "config", "beat", "--loglevel", loglevel, "--schedule", str(schedule)]
    return Process("beat", argv, subprocess_env(**env), ready="beat: Starting...")


def gunicorn(port: int, workers: int | None = 2, threads: int | None = 1, args: tuple[str, ...] = (),
             launcher: tuple[str, ...] = (), **env) -> Process:
    """The API as in production (gunicorn.conf.py); with threads > 1 each worker serves requests concurrently,
    with workers and threads None gunicorn.conf.py's own (as `gunicorn config.wsgi` alone starts it).
    `launcher` runs before it (e.g. `unshare …`), ending with gunicorn's command line."""
    argv = [*launcher, str(BIN / "gunicorn"), "config.wsgi", "--bind", f"127.0.0.1:{port}"]
    if workers is not None:
        argv += ["--workers", str(workers)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    if workers is not None or threads is not None:
        argv += ["--timeout", "60", "--backlog", "256", "--preload"]
    argv += list(args)
    process = Process("gunicorn", argv, subprocess_env(**env), ready="Booting worker")
    process.url = f"http://127.0.0.1:{port}"
    return process


def warm(server: Process, timeout: float = 30) -> Process:
    """Wait until the API answers at once several times running: gunicorn logs "Booting worker" before each
    worker loads Django (about a second), and a test timing its first requests would time that instead."""
    import requests

    deadline, quick = time.monotonic() + timeout, 0
    while quick < 6 and time.monotonic() < deadline:
        started = time.monotonic()
        try:
            requests.get(f"{server.url}/healthz", timeout=5, headers={"Connection": "close"})
            quick = quick + 1 if time.monotonic() - started < 0.2 else 0
        except requests.ConnectionError:
            time.sleep(0.1)
    return server


NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
NGINX_TEMPLATE = ROOT / "deploy" / "nginx" / "herald.conf.template"


def render_nginx_template(**values: str) -> str:
    """Compose's proxy configuration as the nginx image renders it (envsubst with NGINX_ENVSUBST_FILTER):
    only the named variables are replaced, nginx's own $variables stay."""
    return string.Template(NGINX_TEMPLATE.read_text()).safe_substitute(values)


def nginx(http: str, workdir: Path) -> Process:
    """Debian's nginx running `http` (the inside of its http block; files it names live in `workdir`)."""
    if not Path(NGINX).exists():
        raise RuntimeError("nginx is missing: apt-get install -y --no-install-recommends nginx (scripts/test-deps does)")
    workdir.chmod(0o755)   # nginx's workers (another user when started as root) keep request bodies in here
    (workdir / "nginx.conf").write_text(f"""
daemon off;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {workdir}/body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
{http}
}}
""")
    checked = subprocess.run([NGINX, "-t", "-c", str(workdir / "nginx.conf")], capture_output=True, text=True)
    if checked.returncode != 0:
        raise RuntimeError(checked.stderr)
    return Process("nginx", [NGINX, "-c", str(workdir / "nginx.conf")], dict(os.environ))


class RedisServer:
    """A private redis-server without persistence, which a test may stop and start at will."""

    def __init__(self):
        self.port = free_port()
        self.dir = str(run_dir("redis"))
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: Process | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        argv = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
                "--dir", self.dir]
        self.process = Process("redis", argv, dict(os.environ), ready="Ready to accept connections")

    def stop(self) -> None:
        if self.process:
            self.process.kill()
            self.process = None


def prometheus(config: Path, port: int) -> Process:
    """Debian's `prometheus` (scripts/test-deps installs it) with this config file, its data in a run dir."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={run_dir('prometheus')}",
            f"--web.listen-address=127.0.0.1:{port}"]
    process = Process("prometheus", argv, dict(os.environ), ready="Server is ready to receive web requests.")
    process.url = f"http://127.0.0.1:{port}"
    return process
