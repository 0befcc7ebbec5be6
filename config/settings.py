"""Herald settings: everything comes from the environment (SPEC §1); every value has a local default.

This is the one place that reads the environment; the rest of the code reads `django.conf.settings`.
"""
import ipaddress
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

from config.database_url import database_settings
from config.env import env_bool, env_float, env_int, env_list, env_origin, env_origins, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

# Without SECRET_KEY, a development key: with DEBUG off (the default), web, worker and beat refuse to
# start on it (config/startup.py). scripts/up and the tests set keys of their own.
DEV_SECRET_KEY = "herald-dev-secret-key-change-me-in-production-0123456789"
SECRET_KEY = env_str("SECRET_KEY", DEV_SECRET_KEY)
DEBUG = env_bool("DEBUG", False)
# Fernet keys for endpoint secrets at rest (webhooks/crypto.py): the first encrypts, every one decrypts.
# Unset: one key derived from SECRET_KEY, so set this before you ever change SECRET_KEY.
HERALD_ENCRYPTION_KEYS = env_list("HERALD_ENCRYPTION_KEYS", "")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")

# Where users reach Herald (e.g. https://hooks.example.com), usually through a proxy that terminates TLS.
# Portal links are built on it (intake/links.py), its host is allowed, and its origin is trusted by the
# CSRF check of the portal's and the admin's forms: behind a proxy the Host gunicorn sees need not be the
# one in the browser's Origin. When it is https, every cookie is Secure, browsers are told to keep to
# https (HSTS), and a request whose proxy says `X-Forwarded-Proto: https` counts as secure: the proxy in
# front sets that header (deploy/nginx/herald.conf.template; a client that claims https over plain http
# only gets Secure cookies it cannot send back). Unset: a local run over plain http, links built on the
# request's own host.
HERALD_PUBLIC_URL = env_origin("HERALD_PUBLIC_URL")
CSRF_TRUSTED_ORIGINS = [HERALD_PUBLIC_URL] if HERALD_PUBLIC_URL else []
if HERALD_PUBLIC_URL:
    _public_host = urlsplit(HERALD_PUBLIC_URL).hostname
    ALLOWED_HOSTS.append(f"[{_public_host}]" if ":" in _public_host else _public_host)
HERALD_BEHIND_HTTPS = HERALD_PUBLIC_URL.startswith("https://")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HERALD_BEHIND_HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HERALD_BEHIND_HTTPS else None
# Sent only on secure requests; a year, as browsers' preload lists ask (0 turns it off). Not for
# subdomains: Herald cannot know that every other site under its domain speaks https.
SECURE_HSTS_SECONDS = env_int("HERALD_HSTS_SECONDS", 31_536_000) if HERALD_BEHIND_HTTPS else 0

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "axes",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "webhooks",
    "intake",
    "portal",
]

MIDDLEWARE = [
    # First, so it counts what the client gets, a 500 from an exception included (intake/metrics.py).
    "intake.metrics.ResponseMetricsMiddleware",
    "intake.request_id.RequestIdMiddleware",
    # A NUL in the path or query names nothing PostgreSQL can hold: 404/400 before any view (it was a 500).
    "config.nul_guard.refuse_nul_characters",
    "django.middleware.security.SecurityMiddleware",
    # Cache-Control: no-store and the Content Security Policy on portal and admin pages (config/browser_headers.py).
    "config.browser_headers.browser_page_headers",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Before the session middleware, so it sees the session cookie that one sets (portal/middleware.py).
    "portal.middleware.secure_session_cookie_on_https",
    # Outside the session, CSRF and X-Frame-Options middleware, so it sees their cookies and header: the
    # portal's framing (HERALD_PORTAL_FRAME_ANCESTORS, portal/framing.py).
    "portal.middleware.portal_framing",
    "config.middleware.BrowserSessionMiddleware",  # these three: not for /api/v1/ (config/middleware.py)
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "config.middleware.BrowserAuthenticationMiddleware",
    "config.middleware.BrowserMessageMiddleware",
    # Turns an admin login refused for too many failures into its 429 page (see AXES_ below).
    "axes.middleware.AxesMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Over INTAKE_RATE_LIMIT_PER_SECOND: 429 before the idempotency layer, never stored (absent when unset).
    "intake.ratelimit.RateLimitMiddleware",
    # Last, so that it wraps exactly the view: see intake/idempotency/middleware.py.
    "intake.idempotency.middleware.IdempotencyMiddleware",
]

# The proxies in front of Herald whose `X-Forwarded-For` is believed (CIDRs, comma-separated; compose
# names its own network): behind them the client is the right-most address of that header that is not
# one of them (config/proxy.py). Unset: none, and the peer is the client.
HERALD_TRUSTED_PROXIES = env_list("HERALD_TRUSTED_PROXIES", "")
for _cidr in HERALD_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_cidr, strict=False)
    except ValueError:
        raise ImproperlyConfigured(f"HERALD_TRUSTED_PROXIES: {_cidr!r} is not an IP address or CIDR network") from None

# Admin logins (django-axes): after ADMIN_LOGIN_FAILURE_LIMIT failed tries for one user name, from any
# addresses, that user name is refused (429) for ADMIN_LOGIN_LOCKOUT_SECONDS, even with the right password;
# so is an address after as many failed tries, whatever user names they named (one client spraying many
# names). A success clears the count. By user name, not only by (user name, address): a client that can
# present ever new addresses (many hosts, an IPv6 prefix, a proxy of its own) would otherwise guess without
# end. The price: anyone who can reach the login form can lock a user name out for that long, which is why
# compose serves /admin/ only to HERALD_ADMIN_NETWORKS. The address is the client's behind trusted proxies
# (config/proxy.py), never one the client wrote. `manage.py axes_reset` lifts every lock.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("ADMIN_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("ADMIN_LOGIN_LOCKOUT_SECONDS", 900))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]   # either one over the limit locks
AXES_CLIENT_IP_CALLABLE = "config.proxy.client_address"
AXES_RESET_ON_SUCCESS = True

# The Content Security Policy of the portal's and the admin's pages (config/browser_headers.py builds the
# header; the page's style nonce is added there): nothing but Herald's own scripts, styles, images and
# fonts, no plugins, forms posted to Herald only, no <base> and never in a frame.
CONTENT_SECURITY_POLICY = {
    "default-src": "'none'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "font-src": "'self'",
    "connect-src": "'self'",
    "form-action": "'self'",
    "base-uri": "'none'",
    "frame-ancestors": "'none'",
}

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# One host, or several that fail over (`h1:5432,h2:5432/herald?target_session_attrs=read-write`):
# config/database_url.py.
DATABASES = {
    "default": database_settings(env_str("DATABASE_URL", "postgres://127.0.0.1:5432/herald"),
                                 conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60)),
}
DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", env_int("DATABASE_CONNECT_TIMEOUT", 5))
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's, with a health check of reused connections that costs no round trip (config/db/base.py).
    DATABASES["default"]["ENGINE"] = "config.db"
# The web process's queries are cut after this (PostgreSQL's statement_timeout, set for its connections
# only, by config/wsgi.py), so one slow query cannot hold a worker; 0 = no limit. Workers, beat and
# management commands (migrations, retention) are not limited.
WEB_STATEMENT_TIMEOUT_SECONDS = env_float("WEB_STATEMENT_TIMEOUT_SECONDS", 5)
# A web process that stops between two statements of a request's transaction (hung, stopped) is cut
# after this (idle_in_transaction_session_timeout, set the same way): its rollback frees the request's
# idempotency key for the client's retry; 0 = never.
WEB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = env_float("WEB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", 5)
# A worker or beat that stops between two statements of a transaction (its host cut off or powered off, the
# process frozen) has its session ended after this, so the row locks it held (an endpoint's, a delivery's)
# stop holding everyone else back; 0 = never. No worker or beat transaction waits between its statements.
WORKER_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = env_float("WORKER_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", 10)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# The admin's static files are served by gunicorn itself (whitenoise); no separate web server.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# Serve straight from the apps' static folders: no collectstatic step to forget in any deployment.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise warns about a missing root even when using finders

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["intake.authentication.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["intake.permissions.HasCredential"],
    "DEFAULT_PARSER_CLASSES": ["intake.parsers.CheckedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "intake.negotiation.ApiContentNegotiation",
    "EXCEPTION_HANDLER": "intake.problems.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "intake.schema.HeraldAutoSchema",
    "UNAUTHENTICATED_USER": None,
}

# One JSON object per line on stderr, each with the request id of the work it belongs to; or, for a
# person at a terminal (`HERALD_LOG_FORMAT=console`, which scripts/up sets when its output is one), a
# short line per record (config/logs.py). Either way the dispatcher's idle ticks log at DEBUG only.
HERALD_LOG_FORMAT = env_str("HERALD_LOG_FORMAT", "json")
if HERALD_LOG_FORMAT not in ("json", "console"):
    raise ValueError(f"HERALD_LOG_FORMAT must be json or console, not {HERALD_LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "request_id": {"()": "webhooks.logcontext.RequestIdFilter"},
        "quiet_ticks": {"()": "config.logs.QuietTicks", "tasks": ["webhooks.dispatch_due"]},
        "mask_secrets": {"()": "config.logmask.MaskSecretsFilter"},
    },
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(process)d",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger", "process": "pid"},
        },
        "console": {"()": "config.logs.ConsoleFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": HERALD_LOG_FORMAT,
                             "filters": ["request_id", "quiet_ticks", "mask_secrets"]}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "herald": {"level": env_str("HERALD_LOG_LEVEL", "INFO")},
        "django.db.backends": {"level": "INFO"},
        "axes.apps": {"level": "WARNING"},  # its version line at every start of every process
    },
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Herald API",
    "DESCRIPTION": (
        "Self-hosted webhook dispatcher. Authenticate with `Authorization: Bearer <token>`. Every POST and "
        "PATCH requires an `Idempotency-Key`: the first request executes, retries with the same key and "
        "request replay its stored answer byte for byte (`Idempotent-Replay: true`) for 24 hours. Errors are "
        "`application/problem+json` with a stable `code`. Lists are cursor-paginated, newest first."),
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "intake.schema.add_problem_component"],
    "ENUM_NAME_OVERRIDES": {"EndpointAuthTypeEnum": ["basic", "bearer", "oauth2_client_credentials"]},
}

# --- Herald (SPEC §1) -----------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

IDEMPOTENCY_RETENTION_SECONDS = env_int("IDEMPOTENCY_RETENTION_SECONDS", 86400)
# Events older than this whose deliveries are all final are deleted, with their deliveries and
# attempts (webhooks/services/retention.py), by beat every EVENT_RETENTION_INTERVAL_SECONDS, in
# batches of EVENT_RETENTION_BATCH events, for up to EVENT_RETENTION_MAX_SECONDS per run.
# The tenant portal (portal/): a one-time link opens a session for that tenant, which ends on logout
# or after PORTAL_SESSION_SECONDS.
PORTAL_LINK_SECONDS = env_int("PORTAL_LINK_SECONDS", 600)
PORTAL_SESSION_SECONDS = env_int("PORTAL_SESSION_SECONDS", 8 * 3600)
# Origins (space-separated) whose pages may show the portal in a frame: its `Content-Security-Policy:
# frame-ancestors`. Its cookies are then `SameSite=None; Secure` (a framed page is a third party's, so
# only such cookies reach it; browsers keep them over https only). Unset: the portal refuses every frame.
HERALD_PORTAL_FRAME_ANCESTORS = env_origins("HERALD_PORTAL_FRAME_ANCESTORS")
EVENT_RETENTION_DAYS = env_int("EVENT_RETENTION_DAYS", 30)
# Events, deliveries and attempts are kept in partitions of this many days each (webhooks/services/partitions.py):
# retention drops a partition once all of it is past EVENT_RETENTION_DAYS, so an event is kept up to this many days
# longer; fewer, longer partitions cost each statement on these tables less (docs/operations.md, "Retention").
HISTORY_PARTITION_DAYS = env_int("HISTORY_PARTITION_DAYS", 7)
if HISTORY_PARTITION_DAYS < 1:
    raise ValueError(f"HISTORY_PARTITION_DAYS must be at least 1, not {HISTORY_PARTITION_DAYS}")
EVENT_RETENTION_BATCH = env_int("EVENT_RETENTION_BATCH", 1000)
EVENT_RETENTION_INTERVAL_SECONDS = env_float("EVENT_RETENTION_INTERVAL_SECONDS", 600)
EVENT_RETENTION_MAX_SECONDS = env_float("EVENT_RETENTION_MAX_SECONDS", 300)
# After each batch retention rests this many times as long as the batch took: it takes at most
# 1 / (1 + ratio) of one database connection's time from intake and delivery (0: no rest).
EVENT_RETENTION_PAUSE_RATIO = env_float("EVENT_RETENTION_PAUSE_RATIO", 1.0)
IDEMPOTENCY_MISMATCH_STATUS = env_int("IDEMPOTENCY_MISMATCH_STATUS", 409)

# Tenants (SPEC §10). Endpoints one tenant may have, unless its own `max_endpoints` says otherwise.
TENANT_MAX_ENDPOINTS = env_int("TENANT_MAX_ENDPOINTS", 100)
# A deleted tenant's rows are erased by beat every TENANT_ERASURE_INTERVAL_SECONDS, with retention's
# batches and pacing (EVENT_RETENTION_BATCH events at a time, EVENT_RETENTION_PAUSE_RATIO), for up to
# EVENT_RETENTION_MAX_SECONDS per run. It starts no sooner than WEBHOOK_LEASE_SECONDS after the
# deletion, when none of its attempts can still be in flight.
TENANT_ERASURE_INTERVAL_SECONDS = env_float("TENANT_ERASURE_INTERVAL_SECONDS", 30)

WEBHOOK_RETRY_SCHEDULE = env_str("WEBHOOK_RETRY_SCHEDULE", "5,300,1800,7200,18000,36000,36000")
WEBHOOK_RETRY_JITTER = env_float("WEBHOOK_RETRY_JITTER", 0.2)
WEBHOOK_TIMEOUT_SECONDS = env_float("WEBHOOK_TIMEOUT_SECONDS", 15)
WEBHOOK_DISPATCH_INTERVAL_SECONDS = env_float("WEBHOOK_DISPATCH_INTERVAL_SECONDS", 5)
WEBHOOK_ALLOW_PRIVATE_NETWORKS = env_bool("WEBHOOK_ALLOW_PRIVATE_NETWORKS", False)
# The DNS lookup that checks an endpoint's host when it is created or its URL changed: past this, 400.
ENDPOINT_DNS_TIMEOUT_SECONDS = env_float("ENDPOINT_DNS_TIMEOUT_SECONDS", 2)
WEBHOOK_DISABLE_AFTER_SECONDS = env_int("WEBHOOK_DISABLE_AFTER_SECONDS", 432000)
# An HTTP or SOCKS5 proxy every attempt and OAuth2 token request goes through (a static egress
# address); Herald still resolves and checks each host itself (SPEC §11). Unset: direct connections.
WEBHOOK_PROXY_URL = env_str("WEBHOOK_PROXY_URL", "")
if WEBHOOK_PROXY_URL and not WEBHOOK_PROXY_URL.lower().startswith(("http://", "https://", "socks5://", "socks5h://")):
    raise ImproperlyConfigured("WEBHOOK_PROXY_URL must be an http://, https:// or socks5:// URL")
# The CA certificates (a PEM file) receivers' TLS certificates are verified against; unset: certifi's
# bundle of public CAs. For receivers behind a private CA.
WEBHOOK_CA_BUNDLE = env_str("WEBHOOK_CA_BUNDLE", "")

# Attempts in flight per worker process: the capacity of its delivery engine (webhooks/delivery/engine.py).
WEBHOOK_WORKER_CONCURRENCY = env_int("WEBHOOK_WORKER_CONCURRENCY", 1000)
WEBHOOK_ENDPOINT_MAX_IN_FLIGHT = env_int("WEBHOOK_ENDPOINT_MAX_IN_FLIGHT", 10)
WEBHOOK_BREAKER_FAILURES = env_int("WEBHOOK_BREAKER_FAILURES", 5)
WEBHOOK_BREAKER_COOLDOWN_SECONDS = env_float("WEBHOOK_BREAKER_COOLDOWN_SECONDS", 30)

INTAKE_MAX_BODY_BYTES = env_int("INTAKE_MAX_BODY_BYTES", 262144)
# How long a process keeps a credential it looked up, for POSTs and PATCHes only (their key statements
# check it is still live, so a revocation holds at once); 0 disables.
CREDENTIAL_CACHE_SECONDS = env_float("CREDENTIAL_CACHE_SECONDS", 5)
# POST /api/v1/events's usual request answered by one statement (intake/idempotency/fast_events.py); off, every request
# takes the general path (the same answers: a switch to compare the two, or to rule the fast path out).
INTAKE_FAST_PATH = env_bool("INTAKE_FAST_PATH", True)
# When set, /metrics answers only `Authorization: Bearer <METRICS_TOKEN>`; unset, it is open.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# A directory every process of the host writes its metric samples to, summed by /metrics (prometheus_client
# reads the variable itself too); unset: each process serves its own.
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", "")
# Django's own cap must not undercut ours; the intake answers 413 itself.
DATA_UPLOAD_MAX_MEMORY_SIZE = INTAKE_MAX_BODY_BYTES + 1024
# gunicorn's worker (config/gunicorn_worker.py) reads each request whole before a thread takes it:
# one not complete this long after its first byte gets 408, a request line and headers over this
# many bytes 431, a body over INTAKE_MAX_BODY_BYTES 413 before it is read.
WEB_CLIENT_TIMEOUT_SECONDS = env_float("WEB_CLIENT_TIMEOUT_SECONDS", 10)
WEB_MAX_HEADER_BYTES = env_int("WEB_MAX_HEADER_BYTES", 16384)
# A poll endpoint's long-poll (`GET …/messages?wait=`, at most POLL_MAX_WAIT_SECONDS) waits in gunicorn's
# event loop, holding no thread (config/gunicorn_worker.py). Where it cannot (another server, a TLS
# connection gunicorn terminates) it waits on its request's thread, re-reading every
# POLL_THREAD_RECHECK_SECONDS, and at most POLL_THREAD_WAITERS such waits at once per process: the rest
# are answered at once.
POLL_MAX_WAIT_SECONDS = 30
POLL_THREAD_WAITERS = env_int("POLL_THREAD_WAITERS", 1)
POLL_THREAD_RECHECK_SECONDS = env_float("POLL_THREAD_RECHECK_SECONDS", 0.5)
# Long-polls that may wait at once, per credential and per poll endpoint, counted across every web
# process in Redis at REDIS_URL (intake/waits.py); one over a cap is answered 429 `too_many_waits` at once.
POLL_MAX_WAITS_PER_CREDENTIAL = env_int("POLL_MAX_WAITS_PER_CREDENTIAL", 20)
POLL_MAX_WAITS_PER_ENDPOINT = env_int("POLL_MAX_WAITS_PER_ENDPOINT", 4)
# API calls per second per credential, across every web process (a token bucket in Redis, so it
# holds across hosts); unset or 0 = no limit. The bucket holds INTAKE_RATE_LIMIT_BURST calls
# (default: one second's worth). If Redis cannot be reached the limit is not applied, and the log says so.
INTAKE_RATE_LIMIT_PER_SECOND = env_float("INTAKE_RATE_LIMIT_PER_SECOND", 0)
INTAKE_RATE_LIMIT_BURST = env_int("INTAKE_RATE_LIMIT_BURST", max(1, round(INTAKE_RATE_LIMIT_PER_SECOND)))

# --- Traces (SPEC §12; webhooks/tracing.py) ----------------------------------------------------
# OpenTelemetry's own variables. Unset (the default), no tracing: nothing is instrumented and no
# exporter or provider is installed. With OTEL_EXPORTER_OTLP_ENDPOINT (or its _TRACES_ twin) set,
# every web and worker process exports its spans over OTLP/HTTP (protobuf); the SDK reads the rest
# of its variables itself (OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER, OTEL_BSP_*, ...).
# OTEL_SDK_DISABLED=true turns it off again.
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "")
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
TRACING_ENABLED = (bool(OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
                   and not env_bool("OTEL_SDK_DISABLED", False))
# Unset: `herald-web` for gunicorn's processes, `herald-worker` for Celery's.
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME", "")
# The stable HTTP semantic conventions (`http.response.status_code`, `url.full`, ...) for Django's spans too,
# as Herald's own attempt spans use them; `http/dup` adds the old names, `default` keeps only the old.
OTEL_SEMCONV_STABILITY_OPT_IN = env_str("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
# Requests not traced (Prometheus' scrapes, health checks), as OpenTelemetry's Django instrumentation reads it.
OTEL_PYTHON_DJANGO_EXCLUDED_URLS = env_str("OTEL_PYTHON_DJANGO_EXCLUDED_URLS", "/metrics,/healthz")

# --- Celery (read by config/celery.py with the CELERY_ namespace) ---------------------------
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_DEFAULT_QUEUE = env_str("HERALD_QUEUE", "herald")
# Beat's tasks, and the retries and recovered deliveries its dispatcher publishes, get a queue of
# their own, which workers serve in turn with the main one: behind a backlog of fresh deliveries
# the dispatcher and a crashed worker's delivery would otherwise wait their turn for minutes.
HERALD_PERIODIC_QUEUE = CELERY_TASK_DEFAULT_QUEUE + "-periodic"
# On RabbitMQ the queues are durable and messages persistent (Celery's defaults), so a broker restart
# keeps what was queued. HERALD_RABBITMQ_QUEUE_TYPE=quorum makes them quorum queues (replicated
# across a RabbitMQ cluster); changing the type of an existing queue means deleting it first.
BROKER_IS_RABBITMQ = CELERY_BROKER_URL.startswith(("amqp://", "amqps://", "pyamqp://"))
HERALD_RABBITMQ_QUEUE_TYPE = env_str("HERALD_RABBITMQ_QUEUE_TYPE", "classic")
if HERALD_RABBITMQ_QUEUE_TYPE not in ("classic", "quorum"):
    raise ImproperlyConfigured("HERALD_RABBITMQ_QUEUE_TYPE must be classic or quorum")
_QUEUE_ARGUMENTS = ({"x-queue-type": HERALD_RABBITMQ_QUEUE_TYPE}
                    if BROKER_IS_RABBITMQ and HERALD_RABBITMQ_QUEUE_TYPE == "quorum" else None)
CELERY_TASK_QUEUES = tuple(Queue(name, Exchange(name), routing_key=name, queue_arguments=_QUEUE_ARGUMENTS)
                           for name in (CELERY_TASK_DEFAULT_QUEUE, HERALD_PERIODIC_QUEUE))
CELERY_TASK_ROUTES = {name: {"queue": HERALD_PERIODIC_QUEUE} for name in (
    "webhooks.dispatch_due", "webhooks.disable_failing_endpoints", "intake.prune_idempotency_keys",
    "webhooks.prune_events", "intake.erase_tenants", "webhooks.recovery_step")}
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
# A broker outage must not hang intake: fail the publish fast, the dispatcher re-enqueues later.
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_connect_timeout": 2, "socket_timeout": 5}
# RabbitMQ: a publish returns once the broker has taken the message (publisher confirms), so one the
# broker drops raises and its outbox row stays unpublished for the relay's next pass, instead of
# waiting WEBHOOK_REDISPATCH_AFTER_SECONDS for the dispatcher to find it lost.
HERALD_RABBITMQ_CONFIRM_PUBLISH = env_bool("HERALD_RABBITMQ_CONFIRM_PUBLISH", True)
if BROKER_IS_RABBITMQ and HERALD_RABBITMQ_CONFIRM_PUBLISH:
    CELERY_BROKER_TRANSPORT_OPTIONS["confirm_publish"] = True

# --- Delivery internals (not in SPEC §1; defaults derived from it) ---------------------------
# A claimed delivery belongs to its worker this long; past it, a crashed worker's delivery is free.
# It outlasts the attempt's own deadline (WEBHOOK_TIMEOUT_SECONDS, enforced by libcurl) and Celery's
# hard time limit below, so a delivery is never claimed again while its attempt may still be running.
WEBHOOK_LEASE_SECONDS = env_float("WEBHOOK_LEASE_SECONDS", WEBHOOK_TIMEOUT_SECONDS + 15)
# The breaker's pause doubles after each failed probe, up to this (SPEC §1).
WEBHOOK_BREAKER_COOLDOWN_MAX_SECONDS = env_float("WEBHOOK_BREAKER_COOLDOWN_MAX_SECONDS", 600)
# PostgreSQL connections one worker process may hold (a psycopg pool shared by its threads). An
# attempt holds a connection only to claim and to record, never while waiting on the network.
WEBHOOK_WORKER_DB_POOL_SIZE = env_int("WEBHOOK_WORKER_DB_POOL_SIZE", 10)
# A published task not started within this long is presumed lost (flush, restart) and re-published.
WEBHOOK_REDISPATCH_AFTER_SECONDS = env_float("WEBHOOK_REDISPATCH_AFTER_SECONDS", 30)
WEBHOOK_DISPATCH_BATCH = env_int("WEBHOOK_DISPATCH_BATCH", 1000)
# A dispatcher run follows a full batch with the next one for up to this long.
WEBHOOK_DISPATCH_SECONDS = env_float("WEBHOOK_DISPATCH_SECONDS", 2)
# A worker's relay publishes due deliveries when the doorbell rings, and at least this often.
WEBHOOK_RELAY_POLL_SECONDS = env_float("WEBHOOK_RELAY_POLL_SECONDS", 1)
# At most this many delivery ids are published and not yet claimed at once, across every relay: the backlog
# waits in PostgreSQL, where the relays choose fairly across tenants (webhooks/delivery/scheduling.py), and the
# broker's queues stay short. Enough to keep the workers busy between two relay passes.
WEBHOOK_PUBLISH_WINDOW = env_int("WEBHOOK_PUBLISH_WINDOW", 100)
# At most this many delivery ids travel in one message (webhooks/delivery/publishing.py).
WEBHOOK_ENQUEUE_CHUNK = env_int("WEBHOOK_ENQUEUE_CHUNK", 100)
# Each worker writes a heartbeat to PostgreSQL this often (webhooks/liveness.py); /metrics counts as
# live the workers heard from within three intervals (herald_workers_live).
WEBHOOK_WORKER_HEARTBEAT_SECONDS = env_float("WEBHOOK_WORKER_HEARTBEAT_SECONDS", 10)
# A recovery (SPEC §11) resends this many failed deliveries at a time, and the next batch once each of
# them has had its attempt; its step looks at the batch's progress this often (never holding a thread).
WEBHOOK_RECOVER_BATCH = env_int("WEBHOOK_RECOVER_BATCH", 500)
WEBHOOK_RECOVER_POLL_SECONDS = env_float("WEBHOOK_RECOVER_POLL_SECONDS", 0.2)
IDEMPOTENCY_PRUNE_BATCH = env_int("IDEMPOTENCY_PRUNE_BATCH", 5000)
HERALD_VERSION = "0.1.0"

# `celery -A config worker` with no flags: one process, 100 threads that take messages and hand their ids
# to the engine, which keeps WEBHOOK_WORKER_CONCURRENCY attempts in flight on libcurl's multi interface (a
# thread waits only while the engine is full). Eight threads instead of 100 cost a third of the rate at an
# endpoint's default cap (bench, delivery: 326-394/s against 934-997/s), not yet explained; idle threads cost
# little. docs/design.md has the comparison with prefork and gevent. `-c` on the command line sets the threads.
CELERY_WORKER_POOL = "threads"
CELERY_WORKER_CONCURRENCY = 100

# Durability lives in PostgreSQL, not in the broker: a task is only a nudge to look at a row. It is
# acknowledged when the worker takes it (early), so no acknowledgement is left pending on a broker
# connection that can vanish: with late acks, a hundred threads' pending acks ran on a closed Redis
# channel when Redis restarted, and kombu's AttributeError stopped the whole worker every time. A
# worker that dies with messages taken loses nothing: a claimed delivery's lease runs out and beat's
# dispatcher publishes it again (lease + one interval); an unclaimed one is republished as lost
# (WEBHOOK_REDISPATCH_AFTER_SECONDS). A worker reserves no more messages than it has threads.
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Only prefork enforces these (threads cannot be killed); the attempt's own libcurl deadline is what
# bounds an attempt in every pool. Both fall between the deadline and the lease's end (timeout + 5
# and + 10 s by default), so no second worker can claim a delivery whose attempt is still running.
_LEASE_MARGIN = WEBHOOK_LEASE_SECONDS - WEBHOOK_TIMEOUT_SECONDS
if _LEASE_MARGIN <= 0:
    raise ImproperlyConfigured("WEBHOOK_LEASE_SECONDS must be longer than WEBHOOK_TIMEOUT_SECONDS")
CELERY_TASK_SOFT_TIME_LIMIT = WEBHOOK_TIMEOUT_SECONDS + _LEASE_MARGIN / 3
CELERY_TASK_TIME_LIMIT = WEBHOOK_TIMEOUT_SECONDS + 2 * _LEASE_MARGIN / 3
# On Redis, kombu emulates acknowledgements by keeping every message it hands out in a hash until it
# is acknowledged: two more round trips per message on the worker's single consuming thread, which
# measured as its bottleneck (335 -> 700 deliveries/s without them). Herald needs none of it: a
# message the broker forgets is a delivery beat's dispatcher publishes again from PostgreSQL. Off.
CELERY_BROKER_TRANSPORT_OPTIONS["ack_emulation"] = False
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# A periodic task not started before its next run is due is dropped (expires), so beat never
# piles up copies of the same work while the workers are busy.
# Several beats may run (on different hosts): only the holder of a PostgreSQL advisory lock ticks
# (config/beat.py); /healthz reports the age of the dispatcher's last run.
CELERY_BEAT_SCHEDULER = "config.beat:LeaderScheduler"
CELERY_BEAT_SCHEDULE = {
    "dispatch-due-deliveries": {"task": "webhooks.dispatch_due", "schedule": WEBHOOK_DISPATCH_INTERVAL_SECONDS,
                                "options": {"expires": max(10.0, 4 * WEBHOOK_DISPATCH_INTERVAL_SECONDS)}},
    "prune-idempotency-keys": {"task": "intake.prune_idempotency_keys", "schedule": 3600.0,
                               "options": {"expires": 3600.0}},
    "disable-failing-endpoints": {"task": "webhooks.disable_failing_endpoints", "schedule": 300.0,
                                  "options": {"expires": 300.0}},
    "prune-events": {"task": "webhooks.prune_events", "schedule": EVENT_RETENTION_INTERVAL_SECONDS,
                     "options": {"expires": EVENT_RETENTION_INTERVAL_SECONDS}},
    "erase-tenants": {"task": "intake.erase_tenants", "schedule": TENANT_ERASURE_INTERVAL_SECONDS,
                      "options": {"expires": TENANT_ERASURE_INTERVAL_SECONDS}},
}
