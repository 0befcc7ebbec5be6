"""Real Herald processes for tests: Celery workers and beat, gunicorn, a private redis-server, Prometheus."""
import os
import signal
import shutil
import string
import subprocess
import tempfile
import time
from pathlib import Path

from django.conf import settings

from testkit import processes
from testkit.processes import free_port  # noqa: F401 - tests use it from here
from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
BIN = processes.BIN
# Every process's output and scratch files: emptied when a test session starts (tests/conftest.py), kept
# after it for a look at what failed, never left in the machine's temp dir.
RUN_DIR = ROOT / "tests" / "artifacts" / "run"


def run_dir(name: str) -> Path:
    """A new directory under RUN_DIR."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=RUN_DIR))


class Process(processes.Process):
    """A process of one test, its output in a new log file under RUN_DIR."""

    def __init__(self, name: str, argv: list[str], env: dict, ready: str | None = None, timeout: float = 30):
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        log_path = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log", dir=RUN_DIR)[1])
        super().__init__(name, argv, env, log_path, ready=ready, timeout=timeout)


def celery_worker(name: str = "w1", concurrency: int | None = 1, pool: str | None = None,
                  launcher: tuple[str, ...] = (), **env) -> Process:
    """`celery -A config worker` as the README runs it, unless the test asks for another `concurrency`
    (attempts in flight: WEBHOOK_WORKER_CONCURRENCY, and as many threads up to the configured pool's; None: the
    configured ones) or `pool`. `launcher` runs before it (e.g. `unshare …`), ending with its command line."""
    # under pytest-xdist the node name carries the test process's id: on RabbitMQ a node's control queue
    # (`<name>@<host>.celery.pidbox`) is exclusive, and both test processes start a worker "left" at times
    node = f"{name}.{os.environ['PYTEST_XDIST_WORKER']}" if os.environ.get("PYTEST_XDIST_WORKER") else name
    argv = processes.celery_worker_argv(node, "--without-gossip", "--without-mingle", "--without-heartbeat")
    if pool:
        argv += ["--pool", pool]
    if concurrency:
        threads = min(concurrency, settings.CELERY_WORKER_CONCURRENCY)
        argv += ["--concurrency", str(threads if pool in (None, "threads") else concurrency)]
        env.setdefault("WEBHOOK_WORKER_CONCURRENCY", concurrency)
    return Process(f"worker-{name}", [*launcher, *argv], subprocess_env(**env), ready="ready.")


def celery_beat(loglevel: str = "INFO", **env) -> Process:
    """`celery -A config beat`; with `loglevel="DEBUG"` its dispatcher ticks show (they log at DEBUG)."""
    schedule = run_dir("beat") / "schedule"
    argv = processes.celery_beat_argv(schedule, loglevel)
    return Process("beat", argv, subprocess_env(**env), ready="beat: Starting...")


def gunicorn(port: int, workers: int | None = 2, threads: int | None = 1, args: tuple[str, ...] = (),
             launcher: tuple[str, ...] = (), **env) -> Process:
    """The API as in production (gunicorn.conf.py); with threads > 1 each worker serves requests concurrently,
    with workers and threads None gunicorn.conf.py's own (as `gunicorn config.wsgi` alone starts it).
    `launcher` runs before it (e.g. `unshare …`), ending with gunicorn's command line."""
    argv = [*launcher, *processes.gunicorn_argv(port)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    if workers is not None or threads is not None:
        argv += ["--timeout", "60", "--backlog", "256", "--preload"]
    argv += list(args)
    process = Process("gunicorn", argv, subprocess_env(**env), ready="Booting worker")
    process.url = f"http://127.0.0.1:{port}"
    # gunicorn's quick shutdown (SIGQUIT): its graceful one (SIGTERM) lets idle keep-alive connections linger,
    # ~2 s a stop where a test's client kept one, and a run stops about a hundred. The tests that stop the API
    # ask what a client sees when it goes away, which a quick stop asks as well; a test of the drain itself
    # says `stop(sig=signal.SIGTERM)`.
    process.stop_signal = signal.SIGQUIT
    return process


def hosts_launcher(*lines: str) -> tuple[str, ...]:
    """A launcher (for `gunicorn` and `celery_worker`) that runs the process in a mount namespace of its own
    (`unshare --mount`, root) whose /etc/hosts is the machine's plus `lines`: what the system resolver (and
    libcurl's) answers there. The machine's /etc/hosts is never written."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        raise RuntimeError("a private /etc/hosts needs `unshare --mount` as root (tests run as root here and in CI)")
    hosts = run_dir("hosts") / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text().rstrip("\n") + "\n" + "\n".join(lines) + "\n")
    hosts.chmod(0o644)
    hosts.parent.chmod(0o755)
    return ("unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts))


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
        except (requests.ConnectionError, requests.Timeout):   # a worker still loading the app holds the first one
            time.sleep(0.1)
    return server


NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
NGINX_TEMPLATE = ROOT / "deploy" / "nginx" / "herald.conf.template"
NGINX_ADMIN_NETWORKS_SCRIPT = ROOT / "deploy" / "nginx" / "herald-admin-networks.sh"


def render_nginx_template(**values: str) -> str:
    """Compose's proxy configuration as the nginx image renders it (envsubst with NGINX_ENVSUBST_FILTER):
    only the named variables are replaced, nginx's own $variables stay."""
    return string.Template(NGINX_TEMPLATE.read_text()).safe_substitute(values)


def nginx_site(workdir: Path, *, web: str, port: int, admin_networks: str = "", public_url: str = "",
               resolver: str = "127.0.0.1") -> Path:
    """What the nginx image does when compose starts `proxy`: run deploy/nginx/herald-admin-networks.sh (as
    /docker-entrypoint.d/ does) with HERALD_ADMIN_NETWORKS, then render the template; the site's path."""
    networks = workdir / "herald-admin-networks.conf"
    subprocess.run(["sh", str(NGINX_ADMIN_NETWORKS_SCRIPT)], check=True, capture_output=True, timeout=30,
                   env={"PATH": os.environ["PATH"], "HERALD_ADMIN_NETWORKS": admin_networks,
                        "HERALD_ADMIN_NETWORKS_FILE": str(networks)})
    site = workdir / "herald.conf"
    site.write_text(render_nginx_template(HERALD_WEB=web, DNS_RESOLVER=resolver, PROXY_PORT=str(port),
                                          HERALD_PUBLIC_URL=public_url, HERALD_ADMIN_NETWORKS_FILE=str(networks)))
    return site


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
