"""The Celery app, configured from the CELERY_* Django settings (config/celeryconfig.py), JSON only."""
import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("herald")
app.config_from_object("config.celeryconfig")
app.autodiscover_tasks()


@signals.task_prerun.connect
def _check_database_connections(**kwargs) -> None:
    """Drop connections that broke (a PostgreSQL restart) or outlived CONN_MAX_AGE, as Django does."""
    from django.db import close_old_connections

    close_old_connections()
