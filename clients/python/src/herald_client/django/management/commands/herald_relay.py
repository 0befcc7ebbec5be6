"""`python manage.py herald_relay`: send the outbox to Herald (SPEC §13); `--once` sends what is there and exits."""
from __future__ import annotations

import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from herald_client.django.models import OutboxMessage
from herald_client.django.relay import Relay, Round


class Command(BaseCommand):
    help = ("Send committed outbox rows to Herald, in order per tenant, each exactly once; runs until stopped "
            "(SIGTERM or Ctrl-C), or with --once until nothing is left to send.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="send what is there, then exit")
        parser.add_argument("--max-seconds", type=float, default=60.0,
                            help="with --once: give up backing off after this long (default 60); exit 1 if rows "
                                 "are left")
        parser.add_argument("--batch-size", type=int, default=500, help="events per request (1-500, default 500)")
        parser.add_argument("--interval", type=float, default=0.5,
                            help="seconds between looks at an empty outbox (default 0.5)")
        parser.add_argument("--max-backoff", type=float, default=30.0,
                            help="longest wait after a failure, in seconds (default 30)")
        parser.add_argument("--database", default=None, help="the outbox's database alias (default: the router's)")
        parser.add_argument("--failed", action="store_true",
                            help="list the rows Herald refused for good, with its problem, and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["failed"]:
            return self.list_failed(options["database"])
        relay = Relay(using=options["database"], batch_size=options["batch_size"],
                      max_backoff=options["max_backoff"])
        verbose = options["verbosity"] >= 2

        def report(result: Round) -> None:
            if result.failed:
                self.stderr.write(f"herald_relay: {result.failed} row(s) refused by Herald for good "
                                  "(see `herald_relay --failed`)")
            if verbose and result.progressed:
                self.stdout.write(f"herald_relay: sent {result.sent}, failed {result.failed}, "
                                  f"replayed {result.replayed}")

        if options["once"]:
            total = relay.drain(max_seconds=options["max_seconds"], on_round=report)
            left = OutboxMessage.objects.using(relay.using).filter(status=OutboxMessage.PENDING).count()
            self.stdout.write(f"herald_relay: sent {total.sent}, failed {total.failed}, pending {left}, "
                              f"replayed {total.replayed}")
            if left and total.transient:
                raise CommandError("rows are left unsent: " + "; ".join(total.reasons))
            return None
        stopping = []

        def stop(signum: int, frame: Any) -> None:
            stopping.append(signum)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"herald_relay: sending to {relay.client.base_url}", ending="\n")
        self.stdout.flush()
        relay.run(stop=lambda: bool(stopping), interval=options["interval"], on_round=report)
        self.stdout.write("herald_relay: stopped")
        return None

    def list_failed(self, database: str | None) -> None:
        rows = OutboxMessage.objects.using(database).filter(status=OutboxMessage.FAILED).order_by("id")
        for row in rows:
            self.stdout.write(f"{row.id} {row.created_at.isoformat()} {row.type} tenant={row.tenant or '-'}: "
                              f"{row.error}")
