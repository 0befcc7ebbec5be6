"""WSGI entry point: `gunicorn config.wsgi`."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from config.startup import limit_web_statements, refuse_unsafe_start  # noqa: E402 - needs the settings module

refuse_unsafe_start("web")
limit_web_statements()  # before the first connection is made
application = get_wsgi_application()
