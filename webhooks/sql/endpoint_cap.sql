-- An endpoint's cap on attempts in flight: 1 when it is fifo, else its own max_in_flight or the deployment's
-- default (WEBHOOK_ENDPOINT_MAX_IN_FLIGHT). The claim and the hand-on both ask this.
CREATE OR REPLACE FUNCTION herald_endpoint_cap(p_ordering varchar, p_max_in_flight integer, p_default_cap integer)
RETURNS integer
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE WHEN p_ordering = 'fifo' THEN 1 ELSE coalesce(p_max_in_flight, p_default_cap) END
$fn$;
