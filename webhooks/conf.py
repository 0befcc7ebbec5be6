"""Herald's own settings, read in one place: `herald_settings`, as DRF's `api_settings` is for DRF's.

config/settings.py parses them from the environment (SPEC §1 names the variables; the defaults are
there, once); everything else reads them here, grouped by what they govern:
`herald_settings.delivery.WEBHOOK_TIMEOUT_SECONDS`, `herald_settings.queues.retries`. An attribute keeps
the name of its environment variable (the SPEC's name, or the internal one a deployment may set), so
`git grep` finds where a variable is read; the few settings no variable names get a name that says what
they are (`queues.main`, `queues.retries`, `delivery.version`, `tracing.enabled`).

Each value is read from django.conf.settings on first use and kept; Django's `setting_changed` signal
(pytest-django's `settings` fixture, `override_settings`) drops what was kept, so a changed setting is
seen at once. A leaf: it imports nothing of Herald's, so every layer may read it (intake and the portal
too, from above).
"""
from __future__ import annotations

from django.conf import settings
from django.core.signals import setting_changed

# Settings another settings module may leave out (bench's bare floor is Django with none of Herald's).
_WHEN_ABSENT = {"TRACING_ENABLED": False}


class SettingsGroup:
    """Some of Herald's settings: attribute name -> Django setting name."""

    def __init__(self, doc: str, *names: str, **renamed: str) -> None:
        self.__doc__ = doc
        self._names = {**{name: name for name in names}, **renamed}

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            raise AttributeError(attr)
        try:
            name = self._names[attr]
        except KeyError:
            raise AttributeError(f"no Herald setting {attr!r} in this group") from None
        value = getattr(settings, name, _WHEN_ABSENT[name]) if name in _WHEN_ABSENT else getattr(settings, name)
        self.__dict__[attr] = value  # kept: the next read does not come here
        return value

    def _forget(self) -> None:
        for attr in self._names:
            self.__dict__.pop(attr, None)


class HeraldSettings:
    delivery = SettingsGroup(
        "One attempt and what follows it: timeout, retries, the endpoint's cap, the lease, the SSRF policy.",
        "WEBHOOK_TIMEOUT_SECONDS", "WEBHOOK_RETRY_SCHEDULE", "WEBHOOK_RETRY_JITTER", "WEBHOOK_ENDPOINT_MAX_IN_FLIGHT",
        "WEBHOOK_LEASE_SECONDS", "WEBHOOK_DISABLE_AFTER_SECONDS", "WEBHOOK_ALLOW_PRIVATE_NETWORKS",
        "WEBHOOK_PROXY_URL", "WEBHOOK_CA_BUNDLE", "ENDPOINT_DNS_TIMEOUT_SECONDS",
        version="HERALD_VERSION")  # in every attempt's User-Agent
    breaker = SettingsGroup(
        "An endpoint's circuit breaker.",
        "WEBHOOK_BREAKER_FAILURES", "WEBHOOK_BREAKER_COOLDOWN_SECONDS", "WEBHOOK_BREAKER_COOLDOWN_MAX_SECONDS")
    worker = SettingsGroup(
        "A Celery worker process: its engine's capacity, its database pool, its heartbeat.",
        "WEBHOOK_WORKER_CONCURRENCY", "WEBHOOK_WORKER_DB_POOL_SIZE", "WEBHOOK_WORKER_HEARTBEAT_SECONDS",
        "WORKER_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS")
    queues = SettingsGroup(
        "The broker's queues and who fills them: the relays (doorbell on REDIS_URL) and beat's dispatcher.",
        "REDIS_URL", "WEBHOOK_ENQUEUE_CHUNK", "WEBHOOK_RELAY_POLL_SECONDS", "WEBHOOK_DISPATCH_INTERVAL_SECONDS",
        "WEBHOOK_DISPATCH_BATCH", "WEBHOOK_DISPATCH_SECONDS", "WEBHOOK_REDISPATCH_AFTER_SECONDS",
        "WEBHOOK_PUBLISH_WINDOW",
        main="CELERY_TASK_DEFAULT_QUEUE",  # first attempts (HERALD_QUEUE names it)
        retries="HERALD_PERIODIC_QUEUE")  # retries, hand-ons, re-publications and beat's tasks: "<main>-periodic"
    recovery = SettingsGroup(
        "Recoveries (SPEC §11).", "WEBHOOK_RECOVER_BATCH", "WEBHOOK_RECOVER_POLL_SECONDS")
    retention = SettingsGroup(
        "Retention (SPEC §7) and a deleted tenant's erasure (SPEC §10).",
        "EVENT_RETENTION_DAYS", "HISTORY_PARTITION_DAYS", "EVENT_RETENTION_BATCH", "EVENT_RETENTION_INTERVAL_SECONDS",
        "EVENT_RETENTION_MAX_SECONDS", "EVENT_RETENTION_PAUSE_RATIO", "TENANT_ERASURE_INTERVAL_SECONDS")
    api = SettingsGroup(
        "The API: bodies, rate limits, credentials, idempotency, tenants' endpoints.",
        "INTAKE_MAX_BODY_BYTES", "INTAKE_RATE_LIMIT_PER_SECOND", "INTAKE_RATE_LIMIT_BURST", "CREDENTIAL_CACHE_SECONDS",
        "INTAKE_FAST_PATH",
        "IDEMPOTENCY_RETENTION_SECONDS", "IDEMPOTENCY_MISMATCH_STATUS", "IDEMPOTENCY_PRUNE_BATCH",
        "TENANT_MAX_ENDPOINTS")
    polling = SettingsGroup(
        "Poll endpoints' long-polls (SPEC §12).",
        "POLL_MAX_WAIT_SECONDS", "POLL_THREAD_WAITERS", "POLL_THREAD_RECHECK_SECONDS",
        "POLL_MAX_WAITS_PER_CREDENTIAL", "POLL_MAX_WAITS_PER_ENDPOINT")
    web = SettingsGroup(
        "The web process: where users reach it, the proxies in front of it, slow clients, its database limits.",
        "HERALD_PUBLIC_URL", "HERALD_TRUSTED_PROXIES", "WEB_CLIENT_TIMEOUT_SECONDS", "WEB_MAX_HEADER_BYTES",
        "WEB_STATEMENT_TIMEOUT_SECONDS", "WEB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS")
    portal = SettingsGroup("The tenant portal.", "PORTAL_LINK_SECONDS", "PORTAL_SESSION_SECONDS",
                           "HERALD_PORTAL_FRAME_ANCESTORS")
    metrics = SettingsGroup(
        "/metrics: its token, and the directory where every process of a host writes its samples.",
        "METRICS_TOKEN", "PROMETHEUS_MULTIPROC_DIR")
    tracing = SettingsGroup(
        "OpenTelemetry (SPEC §12).",
        "OTEL_SERVICE_NAME", "OTEL_SEMCONV_STABILITY_OPT_IN", "OTEL_PYTHON_DJANGO_EXCLUDED_URLS",
        enabled="TRACING_ENABLED")
    secrets = SettingsGroup("Endpoint secrets at rest.", "HERALD_ENCRYPTION_KEYS")

    def groups(self) -> list[SettingsGroup]:
        return [value for value in vars(type(self)).values() if isinstance(value, SettingsGroup)]

    def names(self) -> set[str]:
        """Every Django setting read here."""
        return {name for group in self.groups() for name in group._names.values()}

    def reload(self) -> None:
        for group in self.groups():
            group._forget()


herald_settings = HeraldSettings()
_NAMES = herald_settings.names()


def _setting_changed(*, setting: str, **kwargs) -> None:
    if setting in _NAMES:
        herald_settings.reload()


setting_changed.connect(_setting_changed)
