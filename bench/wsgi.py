"""The bench's web application: Herald's own (`config.wsgi`), with the key floor (`/floor/…`, bench/floor.py)
served by the same handler as Herald's `/api/v1/`, so the floor and Herald run on the same middleware chain
(config/api_handler.py's `api_middleware()`; the idempotency layer and the rate limit in it pass a path outside
/api/v1/ through). Every other path goes to Herald's application untouched."""
from config.wsgi import application as herald

FLOOR_PREFIX = "/floor/"


def application(environ, start_response):
    if environ.get("PATH_INFO", "").startswith(FLOOR_PREFIX):
        return herald.api(environ, start_response)
    return herald(environ, start_response)
