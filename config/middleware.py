"""Django's session, authentication and messages middleware, for the browser pages only.

The admin, the portal and the API docs need them. REST API calls (/api/v1/) carry a bearer token and
never use a session, a user or a message, yet paid on every request for setting up all three (the
messages' storages and cookie signer alone were about 4 % of an intake request's CPU): here they pass
by. Subclasses, so Django's and the admin's checks still find the middleware they require. (The web
process's WSGI application, config/api_handler.py, runs /api/v1/ on a chain without them at all; this
guard keeps Django's test client and any other handler over the full MIDDLEWARE right.)
"""
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware

API_PREFIX = "/api/v1/"


class _BrowserOnly:
    def __call__(self, request):
        if request.path_info.startswith(API_PREFIX):
            return self.get_response(request)
        return super().__call__(request)


class BrowserSessionMiddleware(_BrowserOnly, SessionMiddleware):
    pass


class BrowserAuthenticationMiddleware(_BrowserOnly, AuthenticationMiddleware):
    pass


class BrowserMessageMiddleware(_BrowserOnly, MessageMiddleware):
    pass
