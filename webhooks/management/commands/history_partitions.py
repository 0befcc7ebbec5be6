"""`manage.py history_partitions`: the partitions of events, deliveries and attempts (webhooks/services/partitions.py).

With no option, lists them (each one's days). `--from DAY [--to DAY]` first makes the missing ones that cover
those days: before importing history of earlier days (rows of days no partition covers go to the default
partition, where retention deletes them in batches instead of dropping them with their partition). Beat makes
the coming days' partitions by itself (DAYS_AHEAD), each time retention runs.
"""
from datetime import date, timedelta

from django.core.management.base import BaseCommand

from webhooks.services import partitions


class Command(BaseCommand):
    help = "List the partitions of events, deliveries and attempts; with --from, make the missing ones first."

    def add_arguments(self, parser):
        parser.add_argument("--from", dest="first", type=date.fromisoformat, help="first day to make (YYYY-MM-DD)")
        parser.add_argument("--to", dest="last", type=date.fromisoformat,
                            help="last day to make (default: DAYS_AHEAD days from today)")

    def handle(self, *args, first: date | None, last: date | None, **options):
        if first is not None or last is not None:
            made = partitions.ensure(first=first, last=last)
            self.stdout.write(f"made {len(made)} partitions")
        for span in partitions.spans():
            self.stdout.write(f"{span.first} to {span.end - timedelta(days=1)}")
