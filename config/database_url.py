"""DATABASE_URL as Django's database settings, a multi-host URL (a PostgreSQL that fails over) included.

dj-database-url reads one host per URL; libpq also takes several
(`postgres://user@h1:5432,h2:5432/herald?target_session_attrs=read-write`) and tries them in turn, keeping
the first that accepts writes. Such a URL is read by libpq's own parser (psycopg's `conninfo_to_dict`) and
handed to Django as comma-separated HOST and PORT, which Django passes to libpq unchanged; its query
parameters (`target_session_attrs`, `sslmode`, `connect_timeout`, …) become connection OPTIONS. Every
process (API, workers, beat, the long-poll listener) connects through these settings, so all of them
follow a failover. A one-host URL goes through dj-database-url as before.
"""
from urllib.parse import urlsplit

import dj_database_url
from psycopg.conninfo import conninfo_to_dict

_DJANGO_KEYS = {"dbname": "NAME", "user": "USER", "password": "PASSWORD", "host": "HOST", "port": "PORT"}


def database_settings(url: str, *, conn_max_age: int) -> dict:
    """Django's DATABASES["default"] for `url`, with persistent connections and Django's health checks."""
    if "," not in urlsplit(url).netloc:
        return dj_database_url.parse(url, conn_max_age=conn_max_age, conn_health_checks=True)
    params = conninfo_to_dict(url)
    settings = {"ENGINE": "django.db.backends.postgresql", "CONN_MAX_AGE": conn_max_age,
                "CONN_HEALTH_CHECKS": True, "OPTIONS": {}}
    for key, value in params.items():
        if key in _DJANGO_KEYS:
            settings[_DJANGO_KEYS[key]] = value
        else:
            settings["OPTIONS"][key] = value
    for name in _DJANGO_KEYS.values():
        settings.setdefault(name, "")
    return settings
