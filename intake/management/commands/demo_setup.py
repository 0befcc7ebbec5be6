"""`manage.py demo_setup --receiver-url URL`: a demo tenant, credential and endpoint for scripts/up.

Prints three lines, `token=…`, `secret=…` and `endpoint=…`, for the launcher to wire up its demo
receiver and print a ready `curl`.
"""
from django.core.management.base import BaseCommand

from intake.credentials import credential_create
from webhooks.services.endpoints import endpoint_create


class Command(BaseCommand):
    help = "Create the quick start's demo tenant, credential and endpoint; print token and secret."

    def add_arguments(self, parser):
        parser.add_argument("--receiver-url", required=True)
        parser.add_argument("--tenant", default="demo")

    def handle(self, *args, receiver_url: str, tenant: str, **options):
        credential, token = credential_create(tenant_name=tenant, name="quick start")
        endpoint = endpoint_create(tenant=credential.tenant, url=receiver_url, event_types=[], channels=[],
                                   description="quick start demo receiver")
        self.stdout.write(f"token={token}")
        self.stdout.write(f"secret={endpoint.current_secret}")
        self.stdout.write(f"endpoint={endpoint.id}")
