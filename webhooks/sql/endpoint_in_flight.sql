-- An endpoint's attempts in flight: its live leases, across every worker. Its room is its cap less these.
CREATE OR REPLACE FUNCTION herald_endpoint_in_flight(p_endpoint varchar)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    RETURN (SELECT count(*) FROM webhooks_deliverylease l WHERE l.endpoint_id = p_endpoint AND l.until > now());
END
$fn$;
