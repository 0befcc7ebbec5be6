-- An outbox row written unpublished without its tenant (a writer that does not know it) takes its delivery's: the relays' fair choice finds due rows by tenant (outbox_fair).
CREATE OR REPLACE FUNCTION herald_outbox_tenant()
RETURNS trigger
LANGUAGE plpgsql
-- Partitioned tables (webhooks/services/partitions.py): a cached plan, pruned as it runs, not one planned per call.
SET plan_cache_mode = force_generic_plan
AS $fn$
BEGIN
    -- The trigger's WHEN has checked that the row is unpublished and has no tenant: intake, a retry's
    -- record and a manual retry write it themselves and pay nothing here.
    SELECT d.tenant_id INTO NEW.tenant_id FROM webhooks_delivery d WHERE d.id = NEW.delivery_id;
    RETURN NEW;
END
$fn$;
