-- The delivery table's triggers' function: what one statement or one row changed, added to a shard.
CREATE OR REPLACE FUNCTION herald_delivery_counted() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM webhooks_deliverycount;
    ELSIF TG_LEVEL = 'ROW' THEN
        -- an update that changed the row's status (the trigger's WHEN)
        PERFORM herald_delivery_count_add((NEW.status = 'pending')::integer - (OLD.status = 'pending')::integer,
                                          (NEW.status = 'failed')::integer - (OLD.status = 'failed')::integer);
    ELSE
        -- an insert or a delete statement: its rows, in the transition table both triggers name `changed`
        PERFORM herald_delivery_count_add(
                    CASE TG_OP WHEN 'INSERT' THEN 1 ELSE -1 END * count(*) FILTER (WHERE status = 'pending'),
                    CASE TG_OP WHEN 'INSERT' THEN 1 ELSE -1 END * count(*) FILTER (WHERE status = 'failed'))
           FROM changed;
    END IF;
    RETURN NULL;
END
$fn$;
