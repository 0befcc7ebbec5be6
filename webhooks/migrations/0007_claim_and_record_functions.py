"""The claim and the record of delivery attempts, and the hand-on of parked ones, as PostgreSQL functions.

Each call is one statement from the worker: one round trip, its own transaction, and plans that
PostgreSQL caches for the session. Sent as multi-statement SQL instead, the server parsed and planned
the queries every time (1.0 ms of PostgreSQL CPU per claim against 0.45 ms as a function, on a 2-core
machine that also runs the worker). The services that call them are in webhooks/services/delivery.py;
the functions are the files in webhooks/sql/, installed after
every migrate (webhooks/sql/__init__.py says how, and what that trades).

Every claim and record of an endpoint's deliveries holds the endpoint's row lock (FOR NO KEY UPDATE,
which intake's foreign-key checks do not wait for); each statement after it takes a fresh snapshot,
so it counts the endpoint's live leases and reads its breaker as they are under the lock. A batch
locks all its endpoints first, in id order, as every batch does, and single calls lock one endpoint
only: batches never deadlock.

Also drops the LIKE indexes Django gives varchar primary keys on the two tables written on every
attempt: no query of Herald's uses them.
"""
from django.db import migrations

from webhooks import sql

DROP_LIKE_INDEXES = r"""
DO $$
DECLARE name text;
BEGIN
    FOR name IN SELECT indexname FROM pg_indexes
                 WHERE tablename IN ('webhooks_delivery', 'webhooks_deliverylease')
                   AND indexdef LIKE '%varchar_pattern_ops%'
    LOOP
        EXECUTE format('DROP INDEX %I', name);
    END LOOP;
END $$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0006_ordering_and_throttle"),
    ]

    operations = [
        # the functions themselves are webhooks/sql/*.sql (the only copy), installed here and after every migrate
        migrations.RunPython(sql.migration_install, sql.migration_drop),
        migrations.RunSQL([DROP_LIKE_INDEXES], migrations.RunSQL.noop),
    ]
