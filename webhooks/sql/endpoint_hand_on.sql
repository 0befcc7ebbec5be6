-- Hands an endpoint's free room to its parked deliveries (oldest first): their outbox rows are written due now.
DROP FUNCTION IF EXISTS herald_endpoint_hand_on(varchar, integer, integer);
CREATE OR REPLACE FUNCTION herald_endpoint_hand_on(p_endpoint varchar, p_default_cap integer, p_limit integer,
                                                   p_claiming boolean DEFAULT false)
RETURNS varchar[]
LANGUAGE plpgsql
-- Partitioned tables (webhooks/services/partitions.py): a cached plan, pruned as it runs, not one planned per call.
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_variable
DECLARE
    ep record;
    v_room integer;
    v_handed varchar[];
BEGIN
    -- The caller holds the endpoint's lock. Parked deliveries, oldest first, take the room the
    -- endpoint has now: its free slots (one for fifo), one if its throttle lets an attempt start now,
    -- none while it is tripped (its probe is beat's business) or disabled.
    SELECT * INTO ep FROM webhooks_endpoint e WHERE e.id = p_endpoint;
    IF NOT FOUND OR NOT ep.enabled OR ep.deleted_at IS NOT NULL OR ep.tripped_at IS NOT NULL THEN
        RETURN ARRAY[]::varchar[];
    END IF;
    v_room := herald_endpoint_cap(ep.ordering, ep.max_in_flight, p_default_cap) - herald_endpoint_in_flight(p_endpoint);
    IF ep.throttle_rate IS NOT NULL THEN
        v_room := CASE WHEN coalesce(ep.throttle_tat, now()) <= now() THEN least(v_room, 1) ELSE 0 END;
    END IF;
    v_room := least(v_room, p_limit);
    IF v_room <= 0 THEN
        RETURN ARRAY[]::varchar[];
    END IF;
    -- The caller sends them on (to the periodic queue, or to its engine, which claims them at once):
    -- they are published now, so the dispatcher sends one again if that message is lost. Also with p_claiming
    -- (the caller, a worker's record, claims them in this transaction): that claim runs on the record's clock
    -- (now() is its transaction's start), so a delivery made after that start is not due to it and is left as
    -- it is, and this row is then all that brings it back (a blackbox storm lost one without it).
    WITH handed AS (
        UPDATE webhooks_delivery d SET parked_at = NULL, updated_at = now()
         WHERE d.id IN (SELECT w.id FROM webhooks_delivery w
                         WHERE w.endpoint_id = p_endpoint AND w.parked_at IS NOT NULL ORDER BY w.id LIMIT v_room)
        RETURNING d.id
    ), published AS (
        INSERT INTO webhooks_deliveryoutbox AS o (delivery_id, due_at, published_at, periodic)
        SELECT handed.id, now(), now(), true FROM handed
        ON CONFLICT (delivery_id) DO UPDATE SET published_at = now(), periodic = true
    )
    SELECT array_agg(handed.id) INTO v_handed FROM handed;
    RETURN coalesce(v_handed, ARRAY[]::varchar[]);
END
$fn$;
