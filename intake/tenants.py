"""Tenants managed by a platform credential (SPEC §10): create, find by id or uid, change, delete, erase.

A tenant is the delivery side's (webhooks.models.Tenant); its credentials and idempotency keys are
intake's (the keys of its own credentials, and the platform's keys of calls made for it). Deleting one is a few small writes in one transaction: the tenant is marked deleted (404 from
then on), its endpoints are taken down (the claim closes whatever was still queued for them: nothing
more is delivered), its credentials revoked and its portal links ended (its portal sessions end).
Beat then erases everything it owns in batches (`tenants_erase`), with retention's pacing
(webhooks/services/retention.py), once no attempt of it can still be in flight and no process can
still hold one of its credentials in its cache.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from intake.credentials import credential_issue, credentials_revoke
from intake.models import ApiCredential, IdempotencyKey
from webhooks.conf import herald_settings
from webhooks.delivery import endpoints
from webhooks.models import Tenant
from webhooks.services.endpoints import TenantGone
from webhooks.services.portal import portal_links_end
from webhooks.services.retention import Erased, Pacer, tenant_erase_owned, tenant_erase_row

logger = logging.getLogger("herald.tenants")

UID_PATTERN = r"[A-Za-z0-9_.:-]{1,128}"
ID_PREFIX = "tnt_"


class UidTaken(Exception):
    """Another live tenant has this uid."""


def tenant_list(*, uid: str | None = None):
    tenants = Tenant.objects.filter(deleted_at__isnull=True)
    return tenants.filter(uid=uid) if uid is not None else tenants


def tenant_get(*, ref: str) -> Tenant | None:
    """The live tenant named by `ref`: its id (`tnt_…`) or its uid. A uid never starts with `tnt_`;
    tenants made before ids were `tnt_…` (`ten_…`) are found by id when no uid matches."""
    live = Tenant.objects.filter(deleted_at__isnull=True)
    if ref.startswith(ID_PREFIX):
        return live.filter(pk=ref).first()
    return live.filter(uid=ref).first() or live.filter(pk=ref).first()


def tenant_create(*, name: str, uid: str | None = None, max_endpoints: int | None = None,
                  metadata: dict | None = None, delivery_weight: int = 1) -> Tenant:
    try:
        with transaction.atomic():
            return Tenant.objects.create(name=name, uid=uid, max_endpoints=max_endpoints, metadata=metadata or {},
                                         delivery_weight=delivery_weight)
    except IntegrityError as exc:
        if uid is not None and "tenant_live_uid" in str(exc):
            raise UidTaken(uid) from None
        raise


TENANT_UPDATABLE = ("name", "metadata", "max_endpoints", "delivery_weight")


def tenant_update(*, tenant: Tenant, **changes) -> Tenant:
    unknown = set(changes) - set(TENANT_UPDATABLE)
    if unknown:
        raise TypeError(f"cannot update {sorted(unknown)}")
    if changes:
        Tenant.objects.filter(pk=tenant.pk, deleted_at__isnull=True).update(**changes)
    tenant.refresh_from_db()
    return tenant


@transaction.atomic
def tenant_delete(*, tenant: Tenant) -> Tenant:
    """Stop the tenant at once (see the module doc); beat erases the rest."""
    now = timezone.now()
    # The row lock first: an endpoint being created for it (which holds that lock) commits before, and
    # is taken down below with the others.
    Tenant.objects.filter(pk=tenant.pk, deleted_at__isnull=True).update(deleted_at=now)
    endpoints.endpoints_of_tenant_take_down(tenant=tenant, now=now)
    credentials_revoke(credential_ids=list(ApiCredential.objects.filter(tenant=tenant).values_list("pk", flat=True)))
    portal_links_end(tenant=tenant)
    tenant.refresh_from_db()
    logger.info("tenant.deleted", extra={"tenant": tenant.pk})
    return tenant


@transaction.atomic
def tenant_credential_issue(*, tenant: Tenant) -> tuple[ApiCredential, str]:
    """A new credential for the tenant, under its row lock, so that it never outlives a deletion running at
    the same moment: a deletion that got the lock first is seen here (TenantGone), and one that waits for
    it revokes this credential with the others (its revocation runs after this commits). FOR NO KEY
    UPDATE, as an endpoint's creation takes it (webhooks/services/endpoints.py)."""
    if not Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk, deleted_at__isnull=True).exists():
        raise TenantGone(tenant.pk)
    return credential_issue(tenant=tenant, name="made by the platform API")


def tenant_credential_revoke(*, tenant: Tenant, credential_id: int) -> bool:
    """Revoke one of the tenant's credentials (and end the portal sessions it opened); False if it has
    no live credential of that id."""
    if not ApiCredential.objects.filter(pk=credential_id, tenant=tenant, revoked_at__isnull=True).exists():
        return False
    return credentials_revoke(credential_ids=[credential_id]) > 0


# --- Erasure (beat) -------------------------------------------------------------------------------
# Its keys: its own credentials', and the platform's stored answers for it (SPEC §10: the events' data is in
# them, and its uid may be given to a new tenant), each found by its own index.
_KEYS = IdempotencyKey._meta.db_table
_KEYS_SQL = f"""
WITH own AS (
    DELETE FROM {_KEYS} WHERE id IN (
        SELECT k.id FROM {_KEYS} k
         WHERE k.credential_id IN (SELECT c.id FROM {ApiCredential._meta.db_table} c WHERE c.tenant_id = %(tenant)s)
         LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
    RETURNING 1
), platforms AS (
    DELETE FROM {_KEYS} WHERE id IN (
        SELECT k.id FROM {_KEYS} k WHERE k.tenant_id = %(tenant)s LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT (SELECT count(*) FROM own) + (SELECT count(*) FROM platforms)
"""


def _keys_left(tenant_id: str) -> bool:
    keys = IdempotencyKey.objects
    return keys.filter(credential__tenant_id=tenant_id).exists() or keys.filter(tenant_id=tenant_id).exists()


def erasure_grace() -> timedelta:
    """How long after its deletion a tenant's erasure may start: no attempt of it is in flight any more
    (a lease's length). Its credentials were refused from the deletion on, cached or not."""
    return timedelta(seconds=herald_settings.delivery.WEBHOOK_LEASE_SECONDS)


def tenants_erase(*, max_seconds: float | None = None, pause_ratio: float | None = None,
                  batch: int | None = None) -> Erased:
    """Beat: erase deleted tenants, oldest deletion first, batch by batch for up to `max_seconds`; the
    next run goes on where this one stopped."""
    pacer = Pacer(max_seconds=max_seconds, pause_ratio=pause_ratio)
    batch = batch or herald_settings.retention.EVENT_RETENTION_BATCH
    erased, tenants = Erased(), 0
    due = (Tenant.objects.filter(deleted_at__lte=timezone.now() - erasure_grace())
           .order_by("deleted_at").values_list("pk", flat=True))
    for tenant_id in list(due[:100]):
        if pacer.out_of_time or not tenant_erase_owned(tenant_id=tenant_id, pacer=pacer, erased=erased, batch=batch):
            break

        def keys_batch() -> bool:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(_KEYS_SQL, {"tenant": tenant_id, "batch": batch})
                deleted = cursor.fetchone()[0]
            erased.other += deleted
            return deleted > 0

        if not pacer.run(keys_batch) or _keys_left(tenant_id):
            break  # out of time, or a key a request still held: the next run
        try:
            with transaction.atomic():
                credentials = ApiCredential.objects.filter(tenant_id=tenant_id)._raw_delete(connection.alias)
                gone = tenant_erase_row(tenant_id=tenant_id)
        except IntegrityError:  # something of it written meanwhile: the next run erases it first
            logger.warning("tenant.erasure_deferred", extra={"tenant": tenant_id})
            continue
        erased.other += credentials
        if gone:
            tenants += 1
            logger.info("tenant.erased", extra={"tenant": tenant_id})
    logger.info("tenants.erasure", extra={"tenants": tenants, "events": erased.events,
                                          "deliveries": erased.deliveries, "other_rows": erased.other,
                                          "batches": pacer.batches, "seconds": round(pacer.seconds, 3)})
    return erased
