"""Benchmark settings: Herald's own, plus the floor view and the floor Celery task."""
from config.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
CELERY_IMPORTS = ["bench.floor_tasks"]
