"""The bare intake floor of issue "Fast paths": a DRF view with no auth and no middleware at all,
doing only an idempotency key's INSERT … ON CONFLICT DO NOTHING and UPDATE in one transaction, on a
table of its own. It runs in its own gunicorn, started the same way as Herald's (gunicorn.conf.py)."""
