"""The "platform project" the outbox tests run in: a small Django project of a platform that uses
`herald_client.django` (SPEC §13), on the database `PLATFORM_DATABASE_URL` names (PostgreSQL, MySQL/MariaDB
or SQLite). HERALD_API_URL and HERALD_TOKEN come from the environment, as the app falls back to it."""
import os

import dj_database_url

_url = os.environ.get("PLATFORM_DATABASE_URL", "sqlite:////tmp/herald-platform.sqlite3")
if _url.startswith("mysql"):
    import pymysql

    pymysql.install_as_MySQLdb()

SECRET_KEY = "platform-project-test-key-not-secret"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["herald_client.django"]
DATABASES = {"default": dj_database_url.parse(_url)}
if _url.startswith("sqlite"):
    # The platform's own writes and the relay's share one file: wait for the lock rather than fail at once.
    DATABASES["default"]["OPTIONS"] = {"timeout": 20}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "loggers": {"herald_client": {"handlers": ["console"], "level": "INFO"}}}
