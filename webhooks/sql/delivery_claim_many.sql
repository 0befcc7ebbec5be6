-- The claim of a batch: its endpoints locked in id order first (batches never deadlock), then herald_delivery_claim for each.
CREATE OR REPLACE FUNCTION herald_delivery_claim_many(p_ids varchar[], p_lease double precision,
                                                      p_default_cap integer)
RETURNS TABLE (delivery_id varchar, go boolean, number integer, lease_end timestamptz, event_id varchar,
               event_type varchar, payload bytea, request_id varchar, endpoint_id varchar, tenant_id varchar,
               url varchar, tripped boolean, healthy boolean, secrets varchar[], wake_at timestamptz)
LANGUAGE plpgsql
-- Partitioned tables (webhooks/services/partitions.py): a cached plan, pruned as it runs, not one planned per call.
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_variable
DECLARE
    v_id varchar;
BEGIN
    PERFORM 1 FROM webhooks_endpoint e
      WHERE e.id IN (SELECT d.endpoint_id FROM webhooks_delivery d WHERE d.id = ANY(p_ids))
      ORDER BY e.id FOR NO KEY UPDATE;
    FOREACH v_id IN ARRAY p_ids LOOP
        RETURN QUERY SELECT v_id, c.* FROM herald_delivery_claim(v_id, p_lease, p_default_cap, true) c;
    END LOOP;
END
$fn$;
