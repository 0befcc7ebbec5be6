-- Healthy: not tripped, and no failure since its last success (webhooks/delivery/breaker.py's BreakerState.healthy
-- says the same of the row it read). The claim reports it, and the record's fast path requires it.
CREATE OR REPLACE FUNCTION herald_endpoint_healthy(p_tripped_at timestamptz, p_consecutive_failures integer,
                                                   p_failing_since timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT p_tripped_at IS NULL AND p_consecutive_failures = 0 AND p_failing_since IS NULL
$fn$;
