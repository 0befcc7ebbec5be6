"""Settings of the example shop: SQLite next to this file (SHOP_DATABASE to put it elsewhere), and Herald's
outbox app. HERALD_API_URL and HERALD_TOKEN are read from the environment by the app itself."""
import os
from pathlib import Path

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-shop-not-a-secret")
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["shop", "herald_client.django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ.get("SHOP_DATABASE", str(Path(__file__).parent.parent / "shop.sqlite3"))}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
