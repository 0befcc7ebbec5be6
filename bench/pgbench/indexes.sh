#!/bin/bash
# Measured in docs/idempotency.md ("A first execution in one statement"); run it through the machine's heavy-job lock.
# pgbench of herald_event_intake alone (one statement per transaction, simple protocol, as the web process sends it):
# A = every index of webhooks_delivery; B = without delivery_endpoint and delivery_tenant_status. ABBA, 10 s each.
cd "$(dirname "$0")"
DB=${1:?a scratch database, migrated, with one tenant, its credential and one endpoint}
P="psql -h 127.0.0.1 -d $DB -qAt"
pgbench -h 127.0.0.1 -n -M simple -c 4 -j 2 -t 5000 -f event_intake.sql $DB > /dev/null 2>&1   # 20k rows first
$P -c "VACUUM ANALYZE" -c "CHECKPOINT"
drop() { $P -c "DROP INDEX IF EXISTS delivery_endpoint" -c "DROP INDEX IF EXISTS delivery_tenant_status"; }
make() { $P -c "CREATE INDEX IF NOT EXISTS delivery_endpoint ON webhooks_delivery (endpoint_id, id DESC)" \
            -c "CREATE INDEX IF NOT EXISTS delivery_tenant_status ON webhooks_delivery (tenant_id, status, id DESC)"; }
for side in A B B A A B B A; do
  if [ $side = A ]; then make; else drop; fi
  $P -c "CHECKPOINT"
  out=$(pgbench -h 127.0.0.1 -n -M simple -c 4 -j 2 -T 10 -f event_intake.sql $DB 2>&1)
  tps=$(echo "$out" | grep -oP 'tps = \K[0-9.]+')
  lat=$(echo "$out" | grep -oP 'latency average = \K[0-9.]+')
  one=$(pgbench -h 127.0.0.1 -n -M simple -c 1 -T 5 -f event_intake.sql $DB 2>&1 | grep -oP 'latency average = \K[0-9.]+')
  echo "$side c=4 tps $tps latency $lat ms; c=1 latency $one ms"
done
make
