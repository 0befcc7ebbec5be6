"""Settings of the bare floor: Herald's (its database, its web server's settings, which gunicorn.conf.py's worker
reads, and its apps: the web worker, config/gunicorn_worker.py, imports Herald's models and metrics for every
request it serves, the floor's as Herald's), with no middleware at all and no URL but the floor's."""
from config.settings import *  # noqa: F403

DEBUG = False
ALLOWED_HOSTS = ["*"]
MIDDLEWARE: list = []
ROOT_URLCONF = "bench.bare.urls"
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "UNAUTHENTICATED_USER": None,
}
