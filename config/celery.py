"""The Celery app, configured from the CELERY_* Django settings (config/celeryconfig.py), JSON only."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("herald")
app.config_from_object("config.celeryconfig")
app.autodiscover_tasks()
