-- The record of a batch: its endpoints locked in id order first, then herald_delivery_record for each.
CREATE OR REPLACE FUNCTION herald_delivery_record_many(p_records jsonb, p_default_cap integer)
RETURNS TABLE (delivery_id varchar, applied boolean, moved boolean, handed varchar[])
LANGUAGE plpgsql AS $fn$
#variable_conflict use_variable
DECLARE
    r jsonb;
BEGIN
    PERFORM 1 FROM webhooks_endpoint e
      WHERE e.id IN (SELECT x->>'endpoint' FROM jsonb_array_elements(p_records) x)
      ORDER BY e.id FOR NO KEY UPDATE;
    FOR r IN SELECT x FROM jsonb_array_elements(p_records) x LOOP
        RETURN QUERY SELECT (r->>'id')::varchar, x.* FROM herald_delivery_record(
            r->>'id', (r->>'number')::integer, (r->>'started_at')::timestamptz, (r->>'duration_ms')::integer,
            (r->>'response_status')::integer, r->>'response_body', r->>'error', r->>'status',
            (r->>'next_attempt_at')::timestamptz, (r->>'lease_end')::timestamptz, r->>'endpoint', p_default_cap,
            (r->>'fast')::boolean, (r->>'hand_on')::integer, true, coalesce((r->>'claim')::boolean, false)) x;
    END LOOP;
END
$fn$;
