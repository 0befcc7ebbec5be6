"""The portal inside another site's page (SPEC §15): framed only by HERALD_PORTAL_FRAME_ANCESTORS, with its
cookies then SameSite=None; Secure; a portal link's theme on its session's pages; the v1a public key and
the payload filter in the portal. The test client first, then headless Chromium framing it from another
origin."""
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from django.test import Client

from tests.browser import CHROMIUM_ARGS, chromium_ready
from tests.conftest import create_endpoint, make_api
from tests.processes import celery_worker, free_port, gunicorn
from webhooks.models import Endpoint

pytestmark = pytest.mark.django_db(transaction=True)


def _link(api, **body) -> str:
    response = api.post("portal-links", body or None)
    assert response.status_code == 201, response.content
    return urlsplit(response.json()["url"]).path


def _portal(api, **body) -> Client:
    client = Client()
    path = _link(api, **body)
    shown = client.get(path)
    opened = client.post(path, {"csrfmiddlewaretoken": str(shown.context["csrf_token"])})
    assert opened.status_code == 302, opened.content
    return client


def _policy(response) -> dict[str, str]:
    return dict((part.strip().split(" ", 1) + [""])[:2] for part in response["Content-Security-Policy"].split(";"))


def test_without_the_setting_the_portal_refuses_every_frame(api):
    client = _portal(api)
    page = client.get("/portal/")
    assert page.status_code == 200
    assert page["X-Frame-Options"] == "DENY"
    assert _policy(page)["frame-ancestors"] == "'none'"
    assert client.cookies["sessionid"]["samesite"] == "Lax"


def test_with_the_setting_only_those_origins_may_frame_it_and_its_cookies_go_cross_site(api, settings):
    settings.HERALD_PORTAL_FRAME_ANCESTORS = ["https://app.example.com", "https://admin.example.org:8443"]
    client = Client()
    path = _link(api)
    shown = client.get(path)
    assert _policy(shown)["frame-ancestors"] == "https://app.example.com https://admin.example.org:8443"
    assert "X-Frame-Options" not in shown
    csrf = shown.cookies["csrftoken"]
    assert csrf["samesite"] == "None" and csrf["secure"]
    opened = client.post(path, {"csrfmiddlewaretoken": str(shown.context["csrf_token"])})
    session = opened.cookies["sessionid"]
    assert session["samesite"] == "None" and session["secure"] and session["httponly"]
    # the admin is never framed
    admin = Client().get("/admin/login/")
    assert admin["X-Frame-Options"] == "DENY" and _policy(admin)["frame-ancestors"] == "'none'"


def test_the_setting_takes_only_origins(monkeypatch):
    from config.env import env_origins

    monkeypatch.setenv("HERALD_PORTAL_FRAME_ANCESTORS", "https://a.example.com  http://localhost:8000")
    assert env_origins("HERALD_PORTAL_FRAME_ANCESTORS") == ["https://a.example.com", "http://localhost:8000"]
    for bad in ("https://a.example.com/path", "'unsafe-inline'", "https://a.example.com;script-src", "javascript:x"):
        monkeypatch.setenv("HERALD_PORTAL_FRAME_ANCESTORS", bad)
        with pytest.raises(ValueError):
            env_origins("HERALD_PORTAL_FRAME_ANCESTORS")


def test_a_links_theme_is_shown_escaped_on_that_sessions_pages_only(api):
    theme = {"name": "Acme <script>alert(1)</script>", "logo_url": "https://cdn.example.com/logo.png?a=1&b=\"x",
             "accent": "#0a7"}
    client = _portal(api, theme=theme)
    page = client.get("/portal/").content.decode()
    assert "Acme &lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert 'src="https://cdn.example.com/logo.png?a=1&amp;b=&quot;x"' in page
    assert "header { background: #0a7; }" in page
    # the logo's origin, and no other, joins the page's img-src; the accent's <style> carries the nonce
    assert _policy(client.get("/portal/"))["img-src"] == "'self' data: https://cdn.example.com"
    assert '<style nonce="' in page.split("#0a7")[0].rsplit("header {", 1)[0][-60:]
    plain = _portal(api).get("/portal/").content.decode()
    assert "Acme" not in plain and "#0a7" not in plain


@pytest.mark.parametrize(("theme", "field"), [
    ({"accent": "red; } body { display:none"}, "accent"),
    ({"accent": "#12345"}, "accent"),
    ({"logo_url": "http://cdn.example.com/logo.png"}, "logo_url"),
    ({"logo_url": "javascript:alert(1)"}, "logo_url"),
    ({"name": "x" * 101}, "name"),
])
def test_a_theme_that_cannot_be_shown_safely_is_400(api, theme, field):
    response = api.post("portal-links", {"theme": theme})
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error" and "theme" in response.json()["errors"]


def test_the_portal_shows_a_v1a_public_key_and_never_the_private_one(api):
    endpoint = create_endpoint(api, "https://a.example.com/hook", signature="v1a")
    client = _portal(api)
    page = client.get(f"/portal/endpoints/{endpoint['id']}").content
    assert endpoint["secret"].encode() in page and b"whsk_" not in page
    assert b"whsk_" not in client.post(f"/portal/endpoints/{endpoint['id']}/secret").content


def test_the_portal_edits_a_filter_with_the_apis_checks(api):
    endpoint = create_endpoint(api, "https://a.example.com/hook")
    client = _portal(api)
    form = {"form": "edit", "url": "https://a.example.com/hook", "enabled": "on", "ordering": "unordered",
            "signature": "v1", "event_types": "", "channels": "", "description": ""}
    refused = client.post(f"/portal/endpoints/{endpoint['id']}", {**form, "filter": '{"data": {"a": {"$gt": true}}}'})
    assert refused.status_code == 400 and b"/data/a/$gt" in refused.content
    assert client.post(f"/portal/endpoints/{endpoint['id']}", {**form, "filter": "not json"}).status_code == 400
    saved = client.post(f"/portal/endpoints/{endpoint['id']}", {**form, "filter": '{"data": {"a": 1}}'})
    assert saved.status_code == 302
    assert Endpoint.objects.get(pk=endpoint["id"]).filter == {"data": {"a": 1}}


# --- in a browser ---------------------------------------------------------------------------------------


class _Parent(BaseHTTPRequestHandler):
    """Another site's page that frames the portal (its URL in the server's `frame_url`)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = f'<!DOCTYPE html><title>platform</title><h1>Our dashboard</h1>' \
               f'<iframe id="portal" src="{self.server.frame_url}" width="1000" height="700"></iframe>'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _parent_site(port: int, frame_url: str) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), _Parent)
    server.frame_url = frame_url
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.slow
@pytest.mark.parametrize("allowed", [True, False], ids=["framable", "refused"])
def test_in_chromium_another_origin_frames_the_portal_only_when_allowed(django_db_setup, allowed):
    from playwright.sync_api import sync_playwright

    chromium = chromium_ready()
    api = make_api("acme")
    create_endpoint(api, "https://a.example.com/hook", signature="v1a")
    link = _link(api, theme={"name": "Acme Webhooks", "accent": "#0a7"})
    parent_port, herald_port = free_port(), free_port()
    # Two origins (ports) on 127.0.0.1: a secure context for Chromium, so the portal's Secure cookies are
    # kept over plain http here. (Across two sites, localhost and 127.0.0.1, this headless Chromium sends
    # no third-party cookie at all, whatever SameSite says: not tested here.)
    parent_origin = f"http://127.0.0.1:{parent_port}"
    env = {"HERALD_PORTAL_FRAME_ANCESTORS": parent_origin} if allowed else {}
    server = gunicorn(herald_port, workers=1, **env)
    worker = celery_worker("embed", concurrency=1)
    parent = _parent_site(parent_port, f"http://127.0.0.1:{herald_port}{link}")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(parent_origin + "/")
                frame = page.frame_locator("#portal")
                if not allowed:
                    page.wait_for_load_state("load")
                    (inner,) = page.main_frame.child_frames
                    # Chromium refuses to show it: an error page in the frame, never the portal's button
                    assert frame.locator("#continue").count() == 0
                    assert inner.url.startswith("chrome-error://"), inner.url
                    return
                frame.locator("#continue").click()  # a POST with its CSRF cookie, from inside the frame
                endpoint_link = frame.locator("a[href^='/portal/endpoints/ep_']").first
                endpoint_link.wait_for(timeout=15000)  # the session's endpoints page, in the frame
                assert "Acme Webhooks" in frame.locator("header").inner_text()  # the link's theme
                endpoint_link.click()
                frame.locator("#public-key").wait_for(timeout=15000)
                assert frame.locator("#public-key").inner_text().startswith("whpk_")
            finally:
                browser.close()
    finally:
        parent.shutdown()
        worker.stop()
        server.stop()
