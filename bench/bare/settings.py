"""Settings of the bare floor: Herald's database settings, and nothing else of Herald's."""
from config.settings import DATABASES, SECRET_KEY  # noqa: F401

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
