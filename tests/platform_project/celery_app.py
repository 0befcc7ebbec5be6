"""The platform project's own Celery app, as a platform that runs Celery would have it: its beat schedules the
outbox relay task (`herald_client.django.tasks.relay_outbox`) every PLATFORM_RELAY_EVERY seconds and its
worker runs it. Broker and queue come from PLATFORM_BROKER_URL and PLATFORM_QUEUE (the test's own)."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.platform_project.settings")

app = Celery("platform")
app.conf.update(
    broker_url=os.environ["PLATFORM_BROKER_URL"],
    task_default_queue=os.environ["PLATFORM_QUEUE"],
    worker_hijack_root_logger=False,
    beat_schedule={"herald-outbox": {"task": "herald_client.django.tasks.relay_outbox",
                                     "schedule": float(os.environ.get("PLATFORM_RELAY_EVERY", "0.5")),
                                     "kwargs": {"max_seconds": 5}}},
)
app.autodiscover_tasks(["herald_client.django"])


@app.on_after_configure.connect
def _django(sender, **kwargs):
    import django

    django.setup()
