-- POST /api/v1/events on the intake's fast path (intake/idempotency/fast_events.py), whole, in one statement and one
-- transaction: the key's read, its claim, the event with its deliveries and outbox rows, and the stored
-- answer, committed together (SPEC §3). Called in autocommit, so its commit is the statement's own: one
-- round trip and one commit per first execution, one round trip per replay.
--
-- It does only the common case and hands everything else back, having written nothing (outcome
-- 'general': the caller runs the general path, intake/idempotency/middleware.py, which answers it): a
-- credential no longer live, an expired key, a key another request holds. 'replay': the stored answer
-- (the caller compares the fingerprint, then replays or answers the mismatch, as the general path does).
-- 'schema': the type's catalog schema is not the one the caller checked the data against (p_digest; NULL:
-- none); its digest and schema come back, and the caller checks again. 'executed': done, the answer is
-- `body`. A key another request stored between the read and the claim fails the key's INSERT on its unique
-- index: the statement rolls back whole and the caller runs the general path.
--
-- The fan-out (the placeholder `single_event` in double braces below) is not written here: it is webhooks/delivery/fanout.py's (FAST_PATH_FANOUT,
-- the CTEs lists, event, matched, deliveries and outbox of every event's insert, on this function's
-- arguments), put in by webhooks/sql/__init__.py when the function is installed, so the matching rule and the
-- delivery and outbox inserts have one copy. tests/test_intake_fast_path.py sends the same requests through
-- both paths and compares the rows and the answers.
-- The answer's body is the caller's rendering of the event with its deliveries' list cut out
-- (p_body_head ... p_body_tail), the list rendered here as DRF renders it (compact, in delivery id order).
CREATE OR REPLACE FUNCTION herald_event_intake(
    p_credential bigint, p_key varchar, p_fingerprint varchar, p_locks integer[], p_tenant varchar,
    p_event_id varchar, p_type varchar, p_channels jsonb, p_patterns jsonb, p_payload bytea, p_request_id varchar,
    p_now timestamptz, p_digest varchar, p_path varchar, p_headers jsonb, p_body_head bytea, p_body_tail bytea,
    p_retention double precision)
RETURNS TABLE (outcome text, fingerprint varchar, status smallint, headers jsonb, body bytea, encrypted boolean,
               created_at timestamptz, digest varchar, schema jsonb, ring boolean)
LANGUAGE plpgsql
-- Partitioned tables (webhooks/services/partitions.py): a cached plan, pruned as it runs, not one planned per call.
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_row record;
    v_digest varchar;
    v_schema jsonb;
    v_list text;
    v_ring boolean;
    v_polled varchar[];
    v_body bytea;
BEGIN
    -- As the general path's read and claim: a revoked credential, or one of a deleted tenant, gets nothing.
    PERFORM 1 FROM intake_apicredential c LEFT JOIN webhooks_tenant t ON t.id = c.tenant_id
      WHERE c.id = p_credential AND c.revoked_at IS NULL AND t.deleted_at IS NULL;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'general', NULL::varchar, NULL::smallint, NULL::jsonb, NULL::bytea, NULL::boolean,
                            NULL::timestamptz, NULL::varchar, NULL::jsonb, NULL::boolean;
        RETURN;
    END IF;
    SELECT k.fingerprint, k.response_status, k.response_headers, k.response_body, k.response_encrypted, k.created_at,
           k.expires_at <= now() AS expired
      INTO v_row
      FROM intake_idempotencykey k
     WHERE k.credential_id = p_credential AND k.key = p_key AND k.tenant_id IS NULL;
    IF FOUND THEN
        IF v_row.expired THEN  -- an expired key is new: the general path replaces its row
            RETURN QUERY SELECT 'general', NULL::varchar, NULL::smallint, NULL::jsonb, NULL::bytea, NULL::boolean,
                                NULL::timestamptz, NULL::varchar, NULL::jsonb, NULL::boolean;
        ELSE
            RETURN QUERY SELECT 'replay', v_row.fingerprint, v_row.response_status, v_row.response_headers,
                                v_row.response_body, v_row.response_encrypted, v_row.created_at, NULL::varchar,
                                NULL::jsonb, NULL::boolean;
        END IF;
        RETURN;
    END IF;
    SELECT t.schema_digest, t.schema INTO v_digest, v_schema
      FROM webhooks_eventtype t WHERE t.name = p_type AND t.schema_digest IS NOT NULL;
    IF v_digest IS DISTINCT FROM p_digest THEN
        RETURN QUERY SELECT 'schema', NULL::varchar, NULL::smallint, NULL::jsonb, NULL::bytea, NULL::boolean,
                            NULL::timestamptz, v_digest, v_schema, NULL::boolean;
        RETURN;
    END IF;
    -- The general path's claim (intake/idempotency/store.py): the key's lock, then the fingerprint's. A key
    -- held by another request is the general path's to answer (it waits a little, then 409 or a replay).
    IF NOT pg_try_advisory_xact_lock(p_locks[1], p_locks[2]) THEN
        RETURN QUERY SELECT 'general', NULL::varchar, NULL::smallint, NULL::jsonb, NULL::bytea, NULL::boolean,
                            NULL::timestamptz, NULL::varchar, NULL::jsonb, NULL::boolean;
        RETURN;
    END IF;
    PERFORM pg_try_advisory_xact_lock(p_locks[3], p_locks[4]);

    {{single_event}}
    SELECT coalesce(string_agg('{"id":' || to_json(d.id::text)::text || ',"endpoint_id":'
                               || to_json(d.endpoint_id::text)::text || ',"status":"pending"}', ',' ORDER BY d.id), ''),
           coalesce(bool_or(NOT d.polled), false),
           array_agg(DISTINCT d.endpoint_id) FILTER (WHERE d.polled)
      INTO v_list, v_ring, v_polled
      FROM deliveries d;

    v_body := p_body_head || convert_to(v_list, 'UTF8') || p_body_tail;
    -- Fails on the key's unique index if another request stored it since the read: everything rolls back.
    INSERT INTO intake_idempotencykey (credential_id, tenant_id, key, fingerprint, method, path, response_status,
                                       response_headers, response_body, response_encrypted, created_at, expires_at)
    VALUES (p_credential, NULL, p_key, p_fingerprint, 'POST', p_path, 202, p_headers, v_body, false, now(),
            now() + make_interval(secs => p_retention));
    IF v_polled IS NOT NULL THEN  -- poll endpoints' long-polls, woken at commit (webhooks/delivery/publishing.py)
        PERFORM pg_notify('herald_poll', ep) FROM unnest(v_polled) AS ep;
    END IF;
    RETURN QUERY SELECT 'executed', p_fingerprint, 202::smallint, p_headers, v_body, false, now(), NULL::varchar,
                        NULL::jsonb, v_ring;
END
$fn$;
