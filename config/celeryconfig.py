"""Celery configuration, copied once from Django's CELERY_* settings into plain module attributes.

Celery reads its configuration on every publish; reading through Django's lazy settings object
made that a third of the cost of enqueueing a delivery. This module is imported lazily, on the
app's first use, when Django's settings are ready.
"""
from django.conf import settings

globals().update({name[len("CELERY_"):].lower(): getattr(settings, name)
                  for name in dir(settings) if name.startswith("CELERY_")})

# Celery's Django fixup closes the database connection around every task unless this is set, which
# made each delivery pay for a new PostgreSQL connection. Keep connections; config/celery.py instead
# checks them before each task the way Django does between requests (CONN_MAX_AGE, health checks).
CELERY_DB_REUSE_MAX = 10**9
