"""`manage.py reencrypt_secrets`: every stored endpoint secret (signing secrets, and the header values,
auth secrets and private keys of EndpointAccess) re-encrypted under the first key of
HERALD_ENCRYPTION_KEYS, and what other apps keep encrypted (an app config's `reencrypt_secrets`, e.g.
intake's stored idempotent answers); `--new-key` prints a fresh key to put first. See webhooks/crypto.py.

Rotation: prepend a new key (`HERALD_ENCRYPTION_KEYS=new,old`) on every process, run this once, then
drop the old key. Run it as well when you first set HERALD_ENCRYPTION_KEYS on an installation that
used the key derived from SECRET_KEY (list that key too: `--derived-key` prints it).
"""
from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from webhooks import crypto
from webhooks.models import EndpointAccess, EndpointSecret


class Command(BaseCommand):
    help = "Re-encrypt every endpoint secret under the first HERALD_ENCRYPTION_KEYS key."

    def add_arguments(self, parser):
        parser.add_argument("--new-key", action="store_true", help="print a new key and change nothing")
        parser.add_argument("--derived-key", action="store_true",
                            help="print the key derived from SECRET_KEY (used while HERALD_ENCRYPTION_KEYS is unset)")
        parser.add_argument("--batch", type=int, default=500)

    def handle(self, *args, new_key: bool, derived_key: bool, batch: int, **options):
        if new_key or derived_key:
            self.stdout.write(crypto.generate_key() if new_key else crypto.derived_key(settings.SECRET_KEY))
            return
        done = last = 0
        while True:
            with transaction.atomic():
                rows = list(EndpointSecret.objects.select_for_update().filter(pk__gt=last).order_by("pk")[:batch])
                for row in rows:
                    try:
                        row.encrypted_secret = crypto.reencrypt(row.encrypted_secret)
                    except crypto.InvalidToken:
                        raise CommandError(f"no key in HERALD_ENCRYPTION_KEYS opens secret {row.pk} "
                                           f"(of endpoint {row.endpoint_id}); nothing after it was changed") from None
                EndpointSecret.objects.bulk_update(rows, ["encrypted_secret"])
            done += len(rows)
            if len(rows) < batch:
                break
            last = rows[-1].pk
        self.stdout.write(f"re-encrypted {done} secrets under the first key")
        self.stdout.write(f"re-encrypted the access secrets of {self._reencrypt_access(batch)} endpoints "
                          "under the first key")
        for app in apps.get_app_configs():
            if hasattr(app, "reencrypt_secrets"):
                try:
                    count, what = app.reencrypt_secrets(batch_size=batch)
                except crypto.InvalidToken:
                    raise CommandError(f"no key in HERALD_ENCRYPTION_KEYS opens one of {app.label}'s encrypted "
                                       "rows; the rows before it were re-encrypted") from None
                self.stdout.write(f"re-encrypted {count} {what} under the first key")

    def _reencrypt_access(self, batch: int) -> int:
        """Endpoints' header values, auth secrets, private keys and broker URLs (EndpointAccess)."""
        columns = ["encrypted_headers", "encrypted_auth_secret", "encrypted_private_key", "encrypted_url"]
        done, last = 0, ""
        while True:
            with transaction.atomic():
                rows = list(EndpointAccess.objects.select_for_update().filter(pk__gt=last).order_by("pk")[:batch])
                for row in rows:
                    for column in columns:
                        if getattr(row, column):
                            try:
                                setattr(row, column, crypto.reencrypt(getattr(row, column)))
                            except crypto.InvalidToken:
                                raise CommandError(f"no key in HERALD_ENCRYPTION_KEYS opens the {column} of endpoint "
                                                   f"{row.pk}; nothing after it was changed") from None
                # bulk_update leaves updated_at alone: the workers' cache of decrypted access is keyed by it,
                # and the plaintext did not change.
                EndpointAccess.objects.bulk_update(rows, columns)
            done += len(rows)
            if len(rows) < batch:
                return done
            last = rows[-1].pk
