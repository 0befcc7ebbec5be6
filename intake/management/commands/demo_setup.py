"""`manage.py demo_setup --receiver-url URL`: a demo tenant, credential and endpoint for scripts/up.

Prints three lines, `token=…`, `secret=…` and `endpoint=…`, for the launcher to wire up its demo
receiver and print a ready `curl`. With `--repoint ENDPOINT_ID` it creates nothing: it points that
demo endpoint at `--receiver-url` (the launcher does this on every later start, so a changed
RECEIVER_PORT moves the endpoint with the receiver).
"""
from django.core.management.base import BaseCommand

from intake.credentials import credential_create
from webhooks.models import Endpoint
from webhooks.selectors import endpoint_secret
from webhooks.services.endpoints import endpoint_create, endpoint_update


class Command(BaseCommand):
    help = "Create the quick start's demo tenant, credential and endpoint; print token and secret."

    def add_arguments(self, parser):
        parser.add_argument("--receiver-url", required=True)
        parser.add_argument("--tenant", default="demo")
        parser.add_argument("--repoint", metavar="ENDPOINT_ID", help="point this demo endpoint at --receiver-url")

    def handle(self, *args, receiver_url: str, tenant: str, repoint: str | None, **options):
        if repoint:
            endpoint = Endpoint.objects.filter(pk=repoint, deleted_at__isnull=True).first()
            if endpoint is not None and endpoint.url != receiver_url:
                endpoint_update(endpoint=endpoint, url=receiver_url)
                self.stderr.write(f"demo endpoint {repoint} now points at {receiver_url}")
            return
        credential, token = credential_create(tenant_name=tenant, name="quick start")
        endpoint = endpoint_create(tenant=credential.tenant, url=receiver_url, event_types=[], channels=[],
                                   description="quick start demo receiver")
        self.stdout.write(f"token={token}")
        self.stdout.write(f"secret={endpoint_secret(endpoint=endpoint)}")
        self.stdout.write(f"endpoint={endpoint.id}")
