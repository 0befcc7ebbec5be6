"""The registry of destination kinds: each kind's module by name (see this package's doc)."""
from __future__ import annotations

from types import ModuleType

from webhooks.delivery.destinations import amqp, http, nats, poll, redis_stream
from webhooks.delivery.destinations.base import AttemptResult, Verdict

BROKERS: dict[str, ModuleType] = {module.kind: module for module in (amqp, redis_stream, nats)}
KINDS: dict[str, ModuleType] = {http.kind: http, poll.kind: poll, **BROKERS}
# Kinds whose deliveries nobody sends (their consumers read them): intake gives them no outbox row.
NOT_PUSHED = tuple(kind for kind, module in KINDS.items() if not getattr(module, "pushed", True))


def classify(kind: str, result: AttemptResult) -> Verdict:
    """What an attempt's result means for its delivery, as its destination's kind says."""
    return KINDS[kind].classify(result)


def is_broker(kind: str) -> bool:
    return kind in BROKERS
