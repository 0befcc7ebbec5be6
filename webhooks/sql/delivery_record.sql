-- The record of one attempt's outcome: the attempt row, the delivery's next state, the breaker, the lease released and the room handed on.
DROP FUNCTION IF EXISTS herald_delivery_record(varchar, integer, timestamptz, integer, integer, text, varchar, varchar,
                                               timestamptz, timestamptz, varchar, integer, boolean, integer, boolean);
CREATE OR REPLACE FUNCTION herald_delivery_record(
    p_id varchar, p_number integer, p_started_at timestamptz, p_duration_ms integer, p_response_status integer,
    p_response_body text, p_error varchar, p_status varchar, p_next_attempt_at timestamptz,
    p_lease_end timestamptz, p_endpoint varchar, p_default_cap integer, p_fast boolean, p_hand_on integer,
    p_locked boolean DEFAULT false, p_claiming boolean DEFAULT false)
RETURNS TABLE (applied boolean, moved boolean, handed varchar[])
LANGUAGE plpgsql
-- Partitioned tables (webhooks/services/partitions.py): a cached plan, pruned as it runs, not one planned per call.
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_variable
DECLARE
    ep record;
    v_moved boolean := false;
    v_tenant varchar;
    c_pending CONSTANT varchar := 'pending';
BEGIN
    IF p_locked THEN
        SELECT * INTO ep FROM webhooks_endpoint e WHERE e.id = p_endpoint;
    ELSE
        SELECT * INTO ep FROM webhooks_endpoint e WHERE e.id = p_endpoint FOR NO KEY UPDATE;
    END IF;
    -- The fast path (a success on an endpoint the claim saw healthy) applies only if the endpoint,
    -- read under the lock, is still healthy with nothing to reset: the breaker and operational events
    -- are the slow path's business, which calls this with p_fast off.
    IF p_fast AND NOT (ep.enabled AND ep.deleted_at IS NULL
                       AND herald_endpoint_healthy(ep.tripped_at, ep.consecutive_failures, ep.failing_since)) THEN
        RETURN QUERY SELECT false, false, ARRAY[]::varchar[];
        RETURN;
    END IF;
    -- The attempt is recorded whatever happened; the delivery moves on only if our lease still held
    -- it and it is still pending (a delete may have cancelled it meanwhile).
    INSERT INTO webhooks_deliveryattempt (delivery_id, number, started_at, duration_ms, response_status,
                                          response_body, error, created_at)
    VALUES (p_id, p_number, p_started_at, p_duration_ms, p_response_status, p_response_body, p_error, now())
    ON CONFLICT (delivery_id, number) DO NOTHING;
    DELETE FROM webhooks_deliverylease l WHERE l.delivery_id = p_id AND l.until = p_lease_end;
    IF FOUND THEN
        -- A retry changes no indexed column of the delivery: a HOT update where its page has room.
        -- `c_pending`, not the literal: the plan is generic (a parameter), so the planner cannot match the
        -- condition to the partial index of pending deliveries (endpoint_id, id) and read all of that index
        -- for the id (see delivery_claim.sql); it finds the row by its key.
        UPDATE webhooks_delivery d
           SET status = p_status, next_attempt_at = p_next_attempt_at, attempt_count = p_number, updated_at = now()
         WHERE d.id = p_id AND d.status = c_pending
        RETURNING d.tenant_id INTO v_tenant;
        v_moved := FOUND;
        IF v_moved AND p_status = 'pending' THEN
            -- its retry's message, due at its time (a relay publishes it then, in its tenant's turn)
            INSERT INTO webhooks_deliveryoutbox AS o (delivery_id, due_at, published_at, periodic, tenant_id)
            VALUES (p_id, p_next_attempt_at, NULL, true, v_tenant)
            ON CONFLICT (delivery_id) DO UPDATE SET due_at = EXCLUDED.due_at, published_at = NULL, periodic = true,
                                                    tenant_id = EXCLUDED.tenant_id;
        END IF;
    END IF;
    -- Up to p_hand_on parked deliveries take the room the endpoint has now (p_claiming: the caller claims
    -- them in this transaction; see endpoint_hand_on.sql).
    RETURN QUERY SELECT true, v_moved, herald_endpoint_hand_on(p_endpoint, p_default_cap, p_hand_on, p_claiming);
END
$fn$;
