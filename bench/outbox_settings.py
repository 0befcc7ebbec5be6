"""A platform's own Django project for the outbox bench (bench/outbox.py): `herald_client.django` on the
PostgreSQL database `BENCH_PLATFORM_DB` (its own, beside the bench's Herald database)."""
import os

SECRET_KEY = "bench-platform-not-a-secret"
USE_TZ = True
INSTALLED_APPS = ["herald_client.django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "HOST": "127.0.0.1", "PORT": "5432",
                         "NAME": os.environ.get("BENCH_PLATFORM_DB", "herald_bench_platform")}}
