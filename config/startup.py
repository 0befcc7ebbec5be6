"""What the serving processes check and set as they start.

Web, worker and beat refuse to start on an unsafe configuration (SPEC §1), with a one-line reason.

With DEBUG off, a missing SECRET_KEY (the settings then hold a development key) or one that has been
published (the development key, the one docker-compose.yml once shipped) would let anyone forge
sessions and decrypt endpoint secrets, whose default encryption key is derived from it.
Management commands (migrate, create_credential, …) are not refused: they serve no one.
"""
import sys

from django.conf import settings

from webhooks.conf import herald_settings

# Keys anyone can read in this repository or its history.
PUBLISHED_SECRET_KEYS = frozenset({
    "herald-compose-insecure-secret-key-set-SECRET_KEY-in-production",
})


def unsafe_reason() -> str | None:
    """Why this configuration may not serve, or None."""
    if settings.DEBUG:
        return None
    if settings.SECRET_KEY == settings.DEV_SECRET_KEY:
        return ("SECRET_KEY is not set; set it to a long random value (e.g. `python -c \"import secrets; "
                "print(secrets.token_urlsafe(50))\"`), or DEBUG=true for local development")
    if settings.SECRET_KEY in PUBLISHED_SECRET_KEYS:
        return "SECRET_KEY is a published default; set it to a long random value of your own"
    return None


def refuse_unsafe_start(process: str) -> None:
    """Exit with the reason on one line of stderr if this configuration may not serve."""
    reason = unsafe_reason()
    if reason is not None:
        # the process's own stderr: Celery has redirected sys.stderr into its logging by now
        sys.__stderr__.write(f"herald {process}: refusing to start: {reason}\n")
        sys.__stderr__.flush()
        raise SystemExit(1)


# How often PostgreSQL checks, while a web request's statement runs, that the web process is still
# there (client_connection_check_interval): a process killed while its statement waits on a lock has
# its transaction rolled back, and its idempotency key freed, within this long, not after
# WEB_STATEMENT_TIMEOUT_SECONDS. A check is one poll() of the socket; only running statements are checked.
CLIENT_CONNECTION_CHECK_MS = 10


def limit_web_statements() -> None:
    """The web process's PostgreSQL connections cut any statement after WEB_STATEMENT_TIMEOUT_SECONDS
    and any transaction left idle after WEB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS, and notice a web
    process that died within CLIENT_CONNECTION_CHECK_MS (server-side settings sent as the connection
    opens: no round trip per request)."""
    limits = {"statement_timeout": herald_settings.web.WEB_STATEMENT_TIMEOUT_SECONDS,
              "idle_in_transaction_session_timeout": herald_settings.web.WEB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS}
    flags = [f"-c {name}={int(seconds * 1000)}" for name, seconds in limits.items() if seconds > 0]
    flags.append(f"-c client_connection_check_interval={CLIENT_CONNECTION_CHECK_MS}")
    options = settings.DATABASES["default"].setdefault("OPTIONS", {})
    options["options"] = " ".join([options.get("options", ""), *flags]).strip()


# Keepalives PostgreSQL sends on a worker's or beat's session: a host that vanished (cut off, powered off: no
# FIN, no reset, only silence) is noticed after about idle + interval × count seconds, and its session
# ends with what it held: row locks, and the advisory lock of the beat that leads (config/beat.py), so the
# other beat takes over. The operating system's default would wait two hours. Keepalives are only sent on an
# idle connection: when the host vanished just after PostgreSQL answered it (beat's `SELECT 1` each second),
# the answer waits unacknowledged and the kernel retransmits it for about 15 minutes instead (a CI run lost
# its leading beat that way, 2026-12-06); tcp_user_timeout (Linux's TCP_USER_TIMEOUT) bounds that wait too.
DEAD_PEER_KEEPALIVES = {"tcp_keepalives_idle": 5, "tcp_keepalives_interval": 2, "tcp_keepalives_count": 3,
                        "tcp_user_timeout": (5 + 2 * 3) * 1000}


def worker_session_options(*, idle_in_transaction: bool = True) -> str:
    """PostgreSQL startup options of a worker's or beat's sessions: the keepalives above, and (unless the session
    never opens a transaction) WORKER_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS."""
    flags = [f"-c {name}={value}" for name, value in DEAD_PEER_KEEPALIVES.items()]
    idle = herald_settings.worker.WORKER_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS
    if idle_in_transaction and idle > 0:
        flags.append(f"-c idle_in_transaction_session_timeout={int(idle * 1000)}")
    return " ".join(flags)


def limit_worker_sessions() -> None:
    """A worker's or beat's database sessions end when their host is lost (worker_session_options); set before
    the process's first connection, as limit_web_statements is for the web's."""
    options = settings.DATABASES["default"].setdefault("OPTIONS", {})
    options["options"] = " ".join([options.get("options", ""), worker_session_options()]).strip()


def freeze_startup_objects() -> None:
    """Move every object alive now (modules, settings, the app: what lives as long as the process) out of the
    garbage collector's sight (`gc.freeze()`), once a process has started. Full collections then scan only what
    came after, and so does the collection at exit, which otherwise walked the whole startup heap for ~0.5 s of
    CPU in every gunicorn worker, Celery worker and beat that stopped (0.07 s after). In a gunicorn worker
    forked from a preloaded app it also stops collections from writing into pages shared with the master."""
    import gc

    gc.freeze()


def warn_if_autovacuum_off() -> None:
    """Log `database.autovacuum_off` (a warning) when the PostgreSQL server does not autovacuum: a lease is
    inserted and deleted per delivery, an outbox row written and deleted, a count updated, and without vacuum
    their dead rows pile up under every claim (on a server with autovacuum off: 618,000 dead leases, 106 MB,
    after 40 minutes of the fairness bench; docs/operations.md). A worker checks once as it starts; a database it cannot
    reach yet is not this check's business (the worker says so itself)."""
    import logging

    from django.db import DatabaseError, connection

    try:
        autovacuum = autovacuum_setting()
    except DatabaseError:
        return
    finally:
        connection.close()  # before a prefork worker forks its children, or the pool is handed out
    if autovacuum != "on":
        logging.getLogger("herald.startup").warning("database.autovacuum_off", extra={
            "autovacuum": autovacuum, "hint": "turn autovacuum on, or VACUUM webhooks_deliverylease, "
                                              "webhooks_deliveryoutbox and webhooks_deliverycount often"})


def autovacuum_setting() -> str:
    """The PostgreSQL server's `autovacuum` ("on" or "off"), on Django's connection (the bench stamps it too)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        return cursor.fetchone()[0]
