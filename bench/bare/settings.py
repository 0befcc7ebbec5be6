"""Settings of the bare floor: Herald's database settings and those of its web server (gunicorn.conf.py's worker
reads them), and nothing else of Herald's."""
from config.settings import (DATABASES, DEV_SECRET_KEY, INTAKE_MAX_BODY_BYTES, SECRET_KEY, WEB_CLIENT_TIMEOUT_SECONDS,  # noqa: F401
                             WEB_MAX_HEADER_BYTES)

DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["rest_framework"]
MIDDLEWARE: list = []
ROOT_URLCONF = "bench.bare.urls"
USE_TZ = True
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "UNAUTHENTICATED_USER": None,
}
