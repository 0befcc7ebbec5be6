"""A portal link's token never reaches a log line: Django's request warnings (written by the console handler
of LOGGING) and the masking rule itself. gunicorn's and nginx's access logs: tests/test_behind_tls.py."""
import io
import logging

import pytest
from django.test import Client

from config.logmask import mask_secrets

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def console():
    """What LOGGING's console handler writes (JSON lines), as a string."""
    (handler,) = [h for h in logging.getLogger().handlers if h.name == "console"]
    stream = io.StringIO()
    previous = handler.setStream(stream)
    yield stream
    handler.setStream(previous)


def test_djangos_warnings_about_a_link_do_not_carry_its_token(api, console):
    link = api.post("portal-links").json()["url"]
    path = link.split("://", 1)[1].split("/", 1)[1]
    token = path.rsplit("/", 1)[1]
    client = Client(enforce_csrf_checks=True)
    assert client.options(f"/{path}").status_code == 405           # "Method Not Allowed (OPTIONS): <path>"
    assert client.post(f"/{path}").status_code == 403              # "Forbidden (CSRF cookie not set.): <path>"
    assert client.get(f"/{path}x/more").status_code == 404          # "Not Found: <path>"
    written = console.getvalue()
    assert written.count("/portal/open/***") >= 3, written
    assert token not in written


@pytest.mark.parametrize("text,masked", [
    ('"GET /portal/open/AbC-_12 HTTP/1.1" 200', '"GET /portal/open/*** HTTP/1.1" 200'),
    ("Not Found: /portal/open/AbC/extra", "Not Found: /portal/open/***/extra"),
    ("<WSGIRequest: POST '/portal/open/AbC'>", "<WSGIRequest: POST '/portal/open/***'>"),
    ("https://h.example/portal/open/AbC?x=1 and /portal/open/Def", "https://h.example/portal/open/***?x=1 and /portal/open/***"),
    ("/portal/endpoints/ep_1", "/portal/endpoints/ep_1"),
])
def test_the_masking_rule(text, masked):
    assert mask_secrets(text) == masked
