"""What a tenant owns, counted model by model: the erasure and isolation tests' picture of "everything"
(SPEC §10), derived from the app registry, not written by hand.

A model is a tenant's when a chain of foreign keys leads from it to Tenant (Endpoint.tenant,
EndpointSecret.endpoint.tenant, DeliveryLease.delivery.tenant, IdempotencyKey.credential.tenant, …); a
row is the tenant's when any of its model's chains ends at that tenant. A model added later with such a
key is counted without editing this file.
"""
import hashlib
from functools import cache

from django.apps import apps
from django.db.models import Q

from webhooks.models import Tenant

MAX_DEPTH = 4  # the longest chain today is 3 (DeliveryAttempt.delivery.endpoint.tenant)


def _chains(model, depth: int, seen: tuple) -> list[str]:
    """Lookups from `model` to a tenant's id (`tenant_id`, `endpoint__tenant_id`, …)."""
    found = []
    for field in model._meta.get_fields():
        if not (field.concrete and field.is_relation and (field.many_to_one or field.one_to_one)):
            continue
        target = field.related_model
        if target is Tenant:
            found.append(f"{field.name}_id")
        elif depth > 1 and target not in seen:
            found += [f"{field.name}__{rest}" for rest in _chains(target, depth - 1, (*seen, target))]
    return found


@cache
def tenant_models() -> dict[str, tuple]:
    """Each model a tenant owns rows of, by label: the lookups from it to the tenant's id (`pk` for Tenant)."""
    owned = {Tenant._meta.label: ("pk",)}
    for model in apps.get_models():
        if model is Tenant:
            continue
        chains = _chains(model, MAX_DEPTH, (model,))
        if chains:
            owned[model._meta.label] = tuple(chains)
    return owned


def owned_rows(tenant_id: str) -> dict[str, int]:
    """Rows of every model a tenant's data lives in, by model label, for `tenant_id` (its own row included)."""
    counts = {}
    for label, chains in tenant_models().items():
        query = Q()
        for chain in chains:
            query |= Q(**{chain: tenant_id})
        counts[label] = apps.get_model(label)._base_manager.filter(query).count()
    return counts


def owned_state(tenant_id: str) -> dict[str, tuple[int, str]]:
    """Like `owned_rows`, with each model's rows' contents too: (count, a digest of every column of every
    row, in primary-key order), so that a row changed in place is seen as well as one added or removed."""
    state = {}
    for label, chains in tenant_models().items():
        query = Q()
        for chain in chains:
            query |= Q(**{chain: tenant_id})
        model = apps.get_model(label)
        columns = [field.attname for field in model._meta.concrete_fields]
        rows = list(model._base_manager.filter(query).order_by("pk").values_list(*columns))
        state[label] = (len(rows), hashlib.sha256(repr(rows).encode()).hexdigest())
    return state
