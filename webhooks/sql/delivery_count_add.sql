-- Adds a change of the pending and failed counts to a shard of webhooks_deliverycount that no other open
-- transaction holds (64 shards; advisory locks keyed 'hrld' = 1752329316), so writers never queue on a counter.
CREATE OR REPLACE FUNCTION herald_delivery_count_add(p_pending bigint, p_failed bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_first integer := pg_backend_pid() % 64;
    v_shard integer;
BEGIN
    IF p_pending = 0 AND p_failed = 0 THEN
        RETURN;
    END IF;
    FOR i IN 0..63 LOOP
        v_shard := (v_first + i) % 64;
        EXIT WHEN pg_try_advisory_xact_lock(1752329316, v_shard);
        v_shard := NULL;
    END LOOP;
    IF v_shard IS NULL THEN
        v_shard := v_first;
        PERFORM pg_advisory_xact_lock(1752329316, v_shard);
    END IF;
    INSERT INTO webhooks_deliverycount AS c (shard, pending, failed) VALUES (v_shard, p_pending, p_failed)
    ON CONFLICT (shard) DO UPDATE SET pending = c.pending + EXCLUDED.pending, failed = c.failed + EXCLUDED.failed;
END
$fn$;
