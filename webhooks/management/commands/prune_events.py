"""`manage.py prune_events`: run retention now, as beat does every EVENT_RETENTION_INTERVAL_SECONDS.

Deletes events older than EVENT_RETENTION_DAYS (or `--days`) whose deliveries are all final, with their
deliveries and attempts, in batches (webhooks/services/retention.py); prints what it deleted.
"""
from django.core.management.base import BaseCommand

from webhooks.services.retention import events_prune


class Command(BaseCommand):
    help = "Delete events past retention whose deliveries are all final, with their deliveries and attempts."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, help="retention in days (default: EVENT_RETENTION_DAYS)")
        parser.add_argument("--max-seconds", type=float, default=3600.0, help="stop after this long (default 3600)")

    def handle(self, *args, days: int | None, max_seconds: float, **options):
        pruned = events_prune(days=days, max_seconds=max_seconds)
        self.stdout.write(f"deleted {pruned.events} events, {pruned.deliveries} deliveries and {pruned.attempts} "
                          f"attempts in {pruned.seconds:.1f} s ({pruned.rows / max(pruned.seconds, 1e-9):.0f} rows/s) "
                          f"in {pruned.batches} batches; kept {pruned.kept} with a pending delivery")
