"""WSGI entry point: `gunicorn config.wsgi`."""
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from config.startup import limit_web_statements, refuse_unsafe_start  # noqa: E402 - needs the settings module

refuse_unsafe_start("web")
limit_web_statements()  # before the first connection is made

from webhooks import tracing  # noqa: E402

tracing.setup("web")  # with OTEL_EXPORTER_OTLP_ENDPOINT set; gunicorn's post_fork did it already
django.setup(set_prefix=False)  # as get_wsgi_application() does

from config.api_handler import Application  # noqa: E402

application = Application()  # /api/v1/ on a middleware chain of its own (config/api_handler.py)
