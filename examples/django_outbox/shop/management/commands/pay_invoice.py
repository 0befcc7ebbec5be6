"""`python manage.py pay_invoice NUMBER [--tenant T] [--fail]`: mark an invoice paid and publish
`invoice.paid`, in one transaction; `--fail` raises after both, so the transaction rolls back."""
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from herald_client.django import publish
from shop.models import Invoice


class Command(BaseCommand):
    help = "Mark an invoice paid and tell Herald, in one transaction."

    def add_arguments(self, parser):
        parser.add_argument("number")
        parser.add_argument("--amount", type=int, default=1200)
        parser.add_argument("--tenant", help="the customer's tenant (id or uid), with a platform token")
        parser.add_argument("--fail", action="store_true", help="fail after publishing: nothing is kept")

    def handle(self, *args, number, amount, tenant, fail, **options):
        try:
            with transaction.atomic():
                invoice, _ = Invoice.objects.get_or_create(number=number, defaults={"amount": amount})
                invoice.paid = True
                invoice.save(update_fields=["paid"])
                row = publish("invoice.paid", {"invoice": number, "amount": invoice.amount}, tenant=tenant)
                if fail:
                    raise CommandError(f"failed after publishing outbox row {row}: rolled back, nothing is sent")
        except CommandError as exc:
            self.stderr.write(str(exc))
            return
        self.stdout.write(f"invoice {number} paid; outbox row {row} will be sent by herald_relay")
