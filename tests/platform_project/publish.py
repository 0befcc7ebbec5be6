"""The platform's own code, as the outbox tests drive it: `python -m tests.platform_project.publish SPEC`
under `tests.platform_project.settings`. SPEC is JSON: `{"migrate": true}` migrates; `{"reset": true}`
empties the outbox; `{"rows": [{"tenant", "n", "rollback"?}, ...], "per_transaction": k}` publishes rows of
`invoice.paid` with data `{"n": n}`, k per transaction, a transaction with a `rollback` row rolled back;
`{"rows": …, "pause": s}` pauses s seconds between transactions. Prints the committed rows' ids as JSON.
`{"age_sent": s, "ids": [...]}` makes those sent rows s seconds old. `{"task": true}` runs the relay's Celery task once. `{"invalid": tenant}` tries what publish() refuses, then publishes one row in the same transaction."""
import json
import sys
import time

import django


class _RolledBack(Exception):
    pass


def main() -> None:
    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    from herald_client.django import publish
    from herald_client.django.models import OutboxMessage

    spec = json.loads(sys.argv[1])
    if spec.get("migrate"):
        call_command("migrate", verbosity=0)
    if spec.get("reset"):
        OutboxMessage.objects.all().delete()
    if spec.get("invalid"):
        # what Herald would refuse anyway is refused at once, and leaves the caller's transaction usable
        refused = []
        with transaction.atomic():
            for args in (("bad type", {}), ("herald.test", {}), ("a.b", None), ("a.b", {"x": object()}),
                         ("a.b", {"x": float("nan")})):
                try:
                    publish(*args)
                except ValueError:
                    refused.append(args[0])
            committed_id = publish("a.b", {"after": "refusals"}, tenant=spec["invalid"])
        print(json.dumps([len(refused), committed_id]), flush=True)
        return
    if spec.get("age_sent"):
        # rows sent `age_sent` seconds ago, as a day later would find them
        from datetime import timedelta

        from django.utils import timezone

        aged = OutboxMessage.objects.filter(status=OutboxMessage.SENT, id__in=spec["ids"]).update(
            sent_at=timezone.now() - timedelta(seconds=spec["age_sent"]))
        print(json.dumps([aged]), flush=True)
        return
    if spec.get("task"):
        # the relay as the platform's Celery beat runs it: the task's own function (a beat sends it by name)
        from herald_client.django.tasks import relay_outbox

        print(json.dumps(relay_outbox(max_seconds=30)), flush=True)
        return
    rows = spec.get("rows", [])
    per = spec.get("per_transaction", 1)
    committed = []
    for start in range(0, len(rows), per):
        group = rows[start:start + per]
        try:
            with transaction.atomic():
                ids = [publish("invoice.paid", {"n": row["n"]}, tenant=row.get("tenant")) for row in group]
                if any(row.get("rollback") for row in group):
                    raise _RolledBack()
            committed.extend(ids)
        except _RolledBack:
            pass
        if spec.get("pause"):
            time.sleep(spec["pause"])
    print(json.dumps(committed), flush=True)


if __name__ == "__main__":
    main()
