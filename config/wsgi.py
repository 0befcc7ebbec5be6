"""WSGI entry point: `gunicorn config.wsgi`."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from config.startup import limit_web_statements, refuse_unsafe_start  # noqa: E402 - needs the settings module

refuse_unsafe_start("web")
limit_web_statements()  # before the first connection is made

from webhooks import tracing  # noqa: E402

tracing.setup("web")  # with OTEL_EXPORTER_OTLP_ENDPOINT set; gunicorn's post_fork did it already
application = get_wsgi_application()
