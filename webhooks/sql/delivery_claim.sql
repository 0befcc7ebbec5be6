-- The claim of one delivery for an attempt: the endpoint's room, breaker, ordering and throttle under its row lock; a lease or a reason why not.
CREATE OR REPLACE FUNCTION herald_delivery_claim(p_id varchar, p_lease double precision, p_default_cap integer,
                                                 p_locked boolean DEFAULT false)
RETURNS TABLE (go boolean, number integer, lease_end timestamptz, event_id varchar, event_type varchar,
               payload bytea, request_id varchar, endpoint_id varchar, tenant_id varchar, url varchar,
               tripped boolean, healthy boolean, secrets varchar[], wake_at timestamptz)
LANGUAGE plpgsql
-- Partitioned tables (webhooks/services/partitions.py): a cached plan, pruned as it runs, not one planned per call.
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_variable
DECLARE
    v_endpoint varchar;
    v_attempts integer;
    v_event varchar;
    v_parked boolean;
    v_status varchar;
    v_claimable boolean;
    v_fifo boolean;
    ep record;
    v_until timestamptz;
    v_tat timestamptz;
BEGIN
    SELECT d.endpoint_id INTO v_endpoint FROM webhooks_delivery d WHERE d.id = p_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_locked THEN
        SELECT * INTO ep FROM webhooks_endpoint e WHERE e.id = v_endpoint;
    ELSE
        SELECT * INTO ep FROM webhooks_endpoint e WHERE e.id = v_endpoint FOR NO KEY UPDATE;
    END IF;
    -- Only a pending, due delivery that no live lease holds can be claimed (a duplicate task finds
    -- nothing to do); an expired lease is a worker that died, and is taken over.
    -- The row is found by its key alone and the rule is read off it: with `status = 'pending'` in the WHERE,
    -- the planner may take the partial index of pending deliveries (endpoint_id, id) instead, and, statistics
    -- made while few deliveries were pending telling it that index is tiny, read all of it for the id: 370
    -- buffers a claim behind a backlog of 20,000, three times the claim's time (tests/test_sql_plans.py).
    SELECT d.attempt_count, d.event_id, d.parked_at IS NOT NULL, d.status,
           d.status = 'pending' AND d.next_attempt_at <= now()
           AND NOT EXISTS (SELECT 1 FROM webhooks_deliverylease l WHERE l.delivery_id = p_id AND l.until > now())
      INTO v_attempts, v_event, v_parked, v_status, v_claimable
      FROM webhooks_delivery d
     WHERE d.id = p_id;
    IF NOT coalesce(v_claimable, false) THEN
        -- A duplicate message, or one for a delivery that is no longer pending: an outbox row of a
        -- finished delivery has nothing left to publish.
        -- Read again as the row is deleted: a manual retry (which takes no endpoint lock) may have made it
        -- pending and written its row since the read above. By the key again, not by `status = 'pending'`.
        IF v_status IS DISTINCT FROM 'pending' THEN
            DELETE FROM webhooks_deliveryoutbox o
             WHERE o.delivery_id = p_id
               AND (SELECT d.status FROM webhooks_delivery d WHERE d.id = p_id) IS DISTINCT FROM 'pending';
        END IF;
        RETURN;
    END IF;
    -- Its message has arrived: whatever is decided below (send, park, close), it needs no other.
    DELETE FROM webhooks_deliveryoutbox o WHERE o.delivery_id = p_id;
    -- Its endpoint was disabled or deleted: it is closed, not sent.
    IF NOT ep.enabled OR ep.deleted_at IS NOT NULL THEN
        UPDATE webhooks_delivery d
           SET status = CASE WHEN ep.deleted_at IS NOT NULL THEN 'cancelled' ELSE 'failed' END,
               next_attempt_at = NULL, parked_at = NULL, updated_at = now()
         WHERE d.id = p_id;
        RETURN;
    END IF;
    -- It may not go now: parked, with no attempt and no retry step used, until a freed slot, the
    -- breaker's probe or the throttle hands it on. It waits if the endpoint is tripped and not due
    -- for its probe; if the endpoint is fifo and an older delivery of it is still pending (the head
    -- goes first, and a failing head holds the rest); if the endpoint is at its cap (1 for fifo); or
    -- if its throttle lets no attempt start yet (the caller is told when one may: wake_at).
    v_fifo := ep.ordering = 'fifo';
    IF (ep.tripped_at IS NOT NULL AND ep.next_probe_at > now())
       OR (v_fifo AND EXISTS (SELECT 1 FROM webhooks_delivery o
                               WHERE o.endpoint_id = v_endpoint AND o.status = 'pending' AND o.id < p_id))
       OR herald_endpoint_in_flight(v_endpoint) >= herald_endpoint_cap(ep.ordering, ep.max_in_flight, p_default_cap)
       OR (ep.throttle_rate IS NOT NULL AND ep.throttle_tat > now()) THEN
        UPDATE webhooks_delivery d SET parked_at = coalesce(d.parked_at, now()), updated_at = now()
         WHERE d.id = p_id;
        IF ep.throttle_rate IS NOT NULL AND ep.throttle_tat > now() THEN
            RETURN QUERY SELECT false, NULL::integer, NULL::timestamptz, NULL::varchar, NULL::varchar, NULL::bytea,
                                NULL::varchar, v_endpoint, NULL::varchar, NULL::varchar, NULL::boolean, NULL::boolean,
                                NULL::varchar[], ep.throttle_tat;
        END IF;
        RETURN;
    END IF;
    INSERT INTO webhooks_deliverylease AS l (delivery_id, endpoint_id, until)
    VALUES (p_id, v_endpoint, now() + make_interval(secs => p_lease))
    ON CONFLICT (delivery_id) DO UPDATE SET until = EXCLUDED.until, endpoint_id = EXCLUDED.endpoint_id
     WHERE l.until <= now()
    RETURNING l.until INTO v_until;
    IF v_until IS NULL THEN
        RETURN;  -- a live lease after all (cannot happen under the endpoint's lock; never send twice at once)
    END IF;
    IF v_parked THEN
        UPDATE webhooks_delivery d SET parked_at = NULL, updated_at = now() WHERE d.id = p_id;
    END IF;
    -- A tripped endpoint's one probe: no other attempt until this one's lease ends or it is recorded.
    -- A throttled endpoint's next attempt may start one interval later (strict pacing: never more
    -- than throttle_rate attempts in any one-second window).
    IF ep.throttle_rate IS NOT NULL THEN
        v_tat := greatest(coalesce(ep.throttle_tat, now()), now()) + make_interval(secs => 1.0 / ep.throttle_rate);
    END IF;
    IF ep.tripped_at IS NOT NULL OR ep.throttle_rate IS NOT NULL THEN
        UPDATE webhooks_endpoint e
           SET next_probe_at = CASE WHEN ep.tripped_at IS NOT NULL THEN v_until ELSE e.next_probe_at END,
               throttle_tat = coalesce(v_tat, e.throttle_tat)
         WHERE e.id = v_endpoint;
    END IF;
    -- The attempt number is the next after those recorded, so a claim whose worker died costs no
    -- retry step.
    RETURN QUERY
    SELECT true, v_attempts + 1, v_until, e.id, e.type, e.payload, e.request_id, v_endpoint, ep.tenant_id, ep.url,
           ep.tripped_at IS NOT NULL,
           herald_endpoint_healthy(ep.tripped_at, ep.consecutive_failures, ep.failing_since),
           ARRAY(SELECT s.secret FROM webhooks_endpointsecret s
                  WHERE s.endpoint_id = v_endpoint AND (s.expires_at IS NULL OR s.expires_at > now())
                  ORDER BY s.created_at DESC, s.id DESC),
           v_tat
      FROM webhooks_event e WHERE e.id = v_event;
END
$fn$;
