"""`manage.py create_credential --tenant NAME` (a tenant credential) or `--platform` (a platform credential,
SPEC §10): issue an API token; it is the last line on stdout."""
from django.core.management.base import BaseCommand, CommandError

from intake.credentials import credential_create, credential_create_platform


class Command(BaseCommand):
    help = ("Create an API credential: for a tenant (--tenant NAME, created if new), or a platform credential "
            "that manages every tenant (--platform). The token is printed once, last.")

    def add_arguments(self, parser):
        kind = parser.add_mutually_exclusive_group(required=True)
        kind.add_argument("--tenant", help="tenant name; created if it does not exist")
        kind.add_argument("--platform", action="store_true",
                          help="a platform credential: manages tenants and acts for any of them")
        parser.add_argument("--name", default="", help="a label for the credential")

    def handle(self, *args, tenant: str | None, platform: bool, name: str, **options):
        if platform:
            credential, token = credential_create_platform(name=name)
            self.stdout.write(f"Created platform credential {credential.id}: it manages every tenant "
                              "under /api/v1/tenants.")
        else:
            if not tenant:
                raise CommandError("--tenant needs a name")
            credential, token = credential_create(tenant_name=tenant, name=name)
            self.stdout.write(f"Created credential {credential.id} for tenant {credential.tenant.name!r} "
                              f"({credential.tenant.id}).")
        self.stdout.write("Store this token now: it is shown only once.")
        self.stdout.write(token)
