"""gunicorn's settings for `gunicorn config.wsgi`, which reads this file from the directory it starts
in (the repository root, or /app in the image). Flags on the command line and WEB_CONCURRENCY /
GUNICORN_THREADS still win.

Measured on a 2-core machine with PostgreSQL, Redis and wrk on the same cores (c=16, first
executions, req/s against the bare floor in the same settings): 2 sync workers 431/385 (bare 1,068),
2 workers x 4 threads 388/392 (bare 1,022), 3 x 2 threads 420/394 (bare 1,104), 4 sync workers
407/388 (bare 1,093): the same within the noise, because the CPU is what runs out. Threads are kept:
an intake request waits on PostgreSQL for about 40 % of its time, which another thread can use, and
a keep-alive connection waits in the worker's poller instead of holding a worker. Each thread keeps
its own PostgreSQL connection: workers x threads (8) per host.
"""
import os

from gunicorn.glogging import Logger


class MaskingLogger(Logger):
    """gunicorn's logger, with secrets in URLs masked in access log lines (request line, path, referer,
    headers): a portal link's token is the link itself (config/logmask.py)."""

    def atoms(self, resp, req, environ, request_time):
        from config.logmask import mask_secrets

        return {name: mask_secrets(value) if isinstance(value, str) else value
                for name, value in super().atoms(resp, req, environ, request_time).items()}


workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# gthread, except that a request is read whole in the worker's event loop before a thread takes it,
# so clients that trickle their headers or body hold no thread (config/gunicorn_worker.py).
worker_class = "config.gunicorn_worker.BufferedThreadWorker"
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
keepalive = 5
logger_class = MaskingLogger  # the access log is off unless --access-logfile (compose turns it on)
backlog = 1024
timeout = 30

# gunicorn 25+ listens on a control socket (for `gunicornc`) at one path per user ($XDG_RUNTIME_DIR or
# ~/.gunicorn/gunicorn.ctl): a second gunicorn of the same user took it over, and removed it on exit. Off,
# unless GUNICORN_CONTROL_SOCKET gives this instance a path of its own.
if os.environ.get("GUNICORN_CONTROL_SOCKET"):
    control_socket = os.environ["GUNICORN_CONTROL_SOCKET"]
else:
    control_socket_disable = True

# Forwarding: gunicorn believes no header from anyone about where the request was mounted or how it came
# (SPEC §2). Its defaults trust loopback (forwarded_allow_ips 127.0.0.1,::1, or FORWARDED_ALLOW_IPS) to
# set `SCRIPT_NAME`/`PATH_INFO` as headers and the scheme by X-Forwarded-Proto/-Protocol/-Ssl; every
# same-host client and any same-host proxy that passes underscore headers on is loopback, so a client could
# move the mount point (`request.path` no longer the routed path) or, with a SCRIPT_NAME the path does not
# start with, get gunicorn's own HTML 500. So: nobody is a trusted forwarder (a Unix socket peer would be
# trusted regardless, hence no forwarder headers either), a header name with an underscore is dropped
# (`SCRIPT_NAME: /x` never reaches the environ), and the scheme is Django's to decide from
# HERALD_PUBLIC_URL (SECURE_PROXY_SSL_HEADER, config/settings.py). A deployment that mounts Herald under a
# prefix says so in the process's own SCRIPT_NAME environment variable, never a client.
forwarded_allow_ips = ""
forwarder_headers = ""
secure_scheme_headers = {}
header_map = "drop"


def on_starting(server) -> None:
    """Refuse to start on an unsafe configuration, once, before any worker boots (config/startup.py)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from config.startup import refuse_unsafe_start

    refuse_unsafe_start("web")


def post_fork(server, worker) -> None:
    """Traces, when OTEL_EXPORTER_OTLP_ENDPOINT is set: each worker process its own exporter (its thread
    does not survive a fork), set up before the application is loaded (webhooks/tracing.py)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from webhooks import tracing

    tracing.setup("web")


def when_ready(server) -> None:
    """The master started (with --preload, the application loaded in it): what lives as long as it does is
    frozen (config/startup.py), before it forks the workers."""
    from config.startup import freeze_startup_objects

    freeze_startup_objects()


def post_worker_init(worker) -> None:
    """The application loaded in a worker (or inherited from a preloading master): what lives as long as the
    worker is frozen (config/startup.py)."""
    from config.startup import freeze_startup_objects

    freeze_startup_objects()
