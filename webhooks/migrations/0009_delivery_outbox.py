"""The outbox: what needs a task message, or has one on its way, in a narrow table of its own.

Publishing used to stamp `enqueued_at` on the delivery row, a non-HOT update that rewrote the row and
its eight indexes (about 30 µs a row: 313 ms of database time for a dispatcher run publishing 10,000
due retries). Now it stamps `published_at` on a DeliveryOutbox row (two small index entries), the
delivery loses `enqueued_at` and the two indexes built on it, and a record that schedules a retry
changes no indexed column of the delivery, so it can be a HOT update (the table keeps room for that on
each page: fillfactor 90).

The functions of migration 0007 that wrote `enqueued_at` are redefined (the batch functions that call
them are unchanged): the hand-on writes an outbox row for the deliveries it sends on, the claim
deletes the row of the delivery it was called for, and the record inserts one for a retry.

Existing rows move over: a pending delivery, neither parked nor claimed, gets its outbox row (published
if it had been); a claimed one gets one when its retry is recorded or, if its worker died, from the
dispatcher.
"""
import importlib

import django.db.models.deletion
from django.db import migrations, models

# the definitions these replace, for the way back
_BEFORE = importlib.import_module("webhooks.migrations.0007_claim_and_record_functions")

HAND_ON = r"""
CREATE OR REPLACE FUNCTION herald_endpoint_hand_on(p_endpoint varchar, p_default_cap integer, p_limit integer)
RETURNS varchar[]
LANGUAGE plpgsql AS $fn$
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
    v_room := (CASE WHEN ep.ordering = 'fifo' THEN 1 ELSE coalesce(ep.max_in_flight, p_default_cap) END)
              - (SELECT count(*) FROM webhooks_deliverylease l WHERE l.endpoint_id = p_endpoint AND l.until > now());
    IF ep.throttle_rate IS NOT NULL THEN
        v_room := CASE WHEN coalesce(ep.throttle_tat, now()) <= now() THEN least(v_room, 1) ELSE 0 END;
    END IF;
    v_room := least(v_room, p_limit);
    IF v_room <= 0 THEN
        RETURN ARRAY[]::varchar[];
    END IF;
    -- The caller sends them on (to the periodic queue, or to its engine, which claims them at once):
    -- they are published now, so the dispatcher sends one again if that message is lost.
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
"""

CLAIM = r"""
CREATE OR REPLACE FUNCTION herald_delivery_claim(p_id varchar, p_lease double precision, p_default_cap integer,
                                                 p_locked boolean DEFAULT false)
RETURNS TABLE (go boolean, number integer, lease_end timestamptz, event_id varchar, event_type varchar,
               payload bytea, request_id varchar, endpoint_id varchar, tenant_id varchar, url varchar,
               tripped boolean, healthy boolean, secrets varchar[], wake_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_variable
DECLARE
    v_endpoint varchar;
    v_attempts integer;
    v_event varchar;
    v_parked boolean;
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
    SELECT d.attempt_count, d.event_id, d.parked_at IS NOT NULL INTO v_attempts, v_event, v_parked
      FROM webhooks_delivery d
     WHERE d.id = p_id AND d.status = 'pending' AND d.next_attempt_at <= now()
       AND NOT EXISTS (SELECT 1 FROM webhooks_deliverylease l WHERE l.delivery_id = p_id AND l.until > now());
    IF NOT FOUND THEN
        -- A duplicate message, or one for a delivery that is no longer pending: an outbox row of a
        -- finished delivery has nothing left to publish.
        DELETE FROM webhooks_deliveryoutbox o
         WHERE o.delivery_id = p_id
           AND NOT EXISTS (SELECT 1 FROM webhooks_delivery d WHERE d.id = p_id AND d.status = 'pending');
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
       OR (SELECT count(*) FROM webhooks_deliverylease l WHERE l.endpoint_id = v_endpoint AND l.until > now())
          >= (CASE WHEN v_fifo THEN 1 ELSE coalesce(ep.max_in_flight, p_default_cap) END)
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
           ep.tripped_at IS NULL AND ep.consecutive_failures = 0 AND ep.failing_since IS NULL,
           ARRAY(SELECT s.secret FROM webhooks_endpointsecret s
                  WHERE s.endpoint_id = v_endpoint AND (s.expires_at IS NULL OR s.expires_at > now())
                  ORDER BY s.created_at DESC, s.id DESC),
           v_tat
      FROM webhooks_event e WHERE e.id = v_event;
END
$fn$;
"""

RECORD = r"""
CREATE OR REPLACE FUNCTION herald_delivery_record(
    p_id varchar, p_number integer, p_started_at timestamptz, p_duration_ms integer, p_response_status integer,
    p_response_body text, p_error varchar, p_status varchar, p_next_attempt_at timestamptz,
    p_lease_end timestamptz, p_endpoint varchar, p_default_cap integer, p_fast boolean, p_hand_on integer,
    p_locked boolean DEFAULT false)
RETURNS TABLE (applied boolean, moved boolean, handed varchar[])
LANGUAGE plpgsql AS $fn$
#variable_conflict use_variable
DECLARE
    ep record;
    v_moved boolean := false;
BEGIN
    IF p_locked THEN
        SELECT * INTO ep FROM webhooks_endpoint e WHERE e.id = p_endpoint;
    ELSE
        SELECT * INTO ep FROM webhooks_endpoint e WHERE e.id = p_endpoint FOR NO KEY UPDATE;
    END IF;
    -- The fast path (a success on an endpoint the claim saw healthy) applies only if the endpoint,
    -- read under the lock, is still healthy with nothing to reset: the breaker and operational events
    -- are the slow path's business, which calls this with p_fast off.
    IF p_fast AND NOT (ep.enabled AND ep.deleted_at IS NULL AND ep.tripped_at IS NULL
                       AND ep.consecutive_failures = 0 AND ep.failing_since IS NULL) THEN
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
        UPDATE webhooks_delivery d
           SET status = p_status, next_attempt_at = p_next_attempt_at, attempt_count = p_number, updated_at = now()
         WHERE d.id = p_id AND d.status = 'pending';
        v_moved := FOUND;
        IF v_moved AND p_status = 'pending' THEN
            -- its retry's message, due at its time (a relay publishes it then)
            INSERT INTO webhooks_deliveryoutbox AS o (delivery_id, due_at, published_at, periodic)
            VALUES (p_id, p_next_attempt_at, NULL, true)
            ON CONFLICT (delivery_id) DO UPDATE SET due_at = EXCLUDED.due_at, published_at = NULL, periodic = true;
        END IF;
    END IF;
    -- Up to p_hand_on parked deliveries take the room the endpoint has now.
    RETURN QUERY SELECT true, v_moved, herald_endpoint_hand_on(p_endpoint, p_default_cap, p_hand_on);
END
$fn$;
"""

FILL_OUTBOX = r"""
INSERT INTO webhooks_deliveryoutbox (delivery_id, due_at, published_at, periodic)
SELECT d.id, coalesce(d.next_attempt_at, d.created_at), d.enqueued_at,
       NOT (d.attempt_count = 0 AND d.next_attempt_at = d.created_at)
  FROM webhooks_delivery d
 WHERE d.status = 'pending' AND d.parked_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM webhooks_deliverylease l WHERE l.delivery_id = d.id)
"""

RESTORE_ENQUEUED_AT = r"""
UPDATE webhooks_delivery d SET enqueued_at = o.published_at
  FROM webhooks_deliveryoutbox o WHERE o.delivery_id = d.id
"""


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0008_dispatch_marks_and_fewer_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="DeliveryOutbox",
            fields=[
                ("delivery", models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE,
                                                  primary_key=True, related_name="outbox", serialize=False,
                                                  to="webhooks.delivery")),
                ("due_at", models.DateTimeField()),
                ("published_at", models.DateTimeField(blank=True, null=True)),
                ("periodic", models.BooleanField(default=False)),
            ],
        ),
        migrations.RunSQL([FILL_OUTBOX], [RESTORE_ENQUEUED_AT]),
        migrations.AddIndex(
            model_name="deliveryoutbox",
            index=models.Index(condition=models.Q(("published_at__isnull", True)), fields=["due_at"], name="outbox_due"),
        ),
        migrations.AddIndex(
            model_name="deliveryoutbox",
            index=models.Index(condition=models.Q(("published_at__isnull", False)), fields=["published_at"],
                               name="outbox_published"),
        ),
        migrations.RemoveIndex(model_name="delivery", name="delivery_waiting"),
        migrations.RemoveIndex(model_name="delivery", name="delivery_due"),
        migrations.RemoveField(model_name="delivery", name="enqueued_at"),
        migrations.RunSQL(["ALTER TABLE webhooks_delivery SET (fillfactor = 90)"],
                          ["ALTER TABLE webhooks_delivery RESET (fillfactor)"]),
        # Each function goes as one statement (a list), not through Django's splitting on semicolons.
        migrations.RunSQL([HAND_ON], [_BEFORE.HAND_ON]),
        migrations.RunSQL([CLAIM], [_BEFORE.CLAIM]),
        migrations.RunSQL([RECORD], [_BEFORE.RECORD]),
    ]
