"""`manage.py create_credential --tenant NAME`: issue an API token; it is the last line on stdout."""
from django.core.management.base import BaseCommand

from intake.credentials import credential_create


class Command(BaseCommand):
    help = "Create an API credential for a tenant (created if new). The token is printed once, last."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant name; created if it does not exist")
        parser.add_argument("--name", default="", help="a label for the credential")

    def handle(self, *args, tenant: str, name: str, **options):
        credential, token = credential_create(tenant_name=tenant, name=name)
        self.stdout.write(f"Created credential {credential.id} for tenant {credential.tenant.name!r} "
                          f"({credential.tenant.id}).")
        self.stdout.write("Store this token now: it is shown only once.")
        self.stdout.write(token)
