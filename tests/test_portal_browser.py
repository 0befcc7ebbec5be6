"""The tenant portal in a real headless Chromium against real gunicorn, worker, beat and a receiver that
verifies signatures: a tenant's developer opens a one-time link, adds an endpoint, sends a test event,
sees it succeed, makes the receiver fail, resends, rotates the secret. Screenshots of every page land in
tests/artifacts/."""
import re
import time
from urllib.parse import urlsplit

import pytest
from standardwebhooks import Webhook

from tests.browser import CHROMIUM_ARGS, chromium_ready, herald  # noqa: F401 - herald is a fixture
from tests.conftest import create_endpoint, make_api
from tests.processes import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ARTIFACTS = ROOT / "tests" / "artifacts"
PAGES = ("portal-endpoints", "portal-endpoint-new", "portal-endpoint", "portal-event", "portal-delivery-succeeded",
         "portal-delivery-resent", "portal-deliveries", "portal-events", "portal-link-refused", "portal-not-found")


def test_a_tenant_developer_works_with_their_endpoints_in_the_browser(herald, receiver):
    from playwright.sync_api import expect, sync_playwright

    chromium = chromium_ready()
    # All ORM and API work outside the Playwright block: its event loop makes Django refuse sync queries.
    api = make_api("acme")
    link = urlsplit(api.post("portal-links").json()["url"]).path
    other = make_api("globex")
    create_endpoint(other, "https://globex.example.com/hook")
    their_delivery = other.delivery_id("invoice.paid")
    hook = receiver.url("/hook")

    def shot(page, name):
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def wait_for_text(page, selector, text, timeout=30.0):
        deadline = time.monotonic() + timeout
        while page.locator(selector).inner_text().strip() != text:
            assert time.monotonic() < deadline, f"{selector} never read {text!r}"
            time.sleep(0.5)
            page.reload()

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    base = herald.url
    broken, blocked = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("response", lambda r: broken.append(f"{r.status} {r.url}")
                    if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
            # what the Content Security Policy blocked, as Chromium reports it (config/browser_headers.py)
            page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)

            # the one-time link opens the tenant's portal
            page.goto(base + link)
            page.click("#continue")
            expect(page).to_have_url(f"{base}/portal/")
            expect(page.locator("header")).to_contain_text("acme")
            # the page's own <style> applied under the policy (its nonce)
            assert page.evaluate("getComputedStyle(document.querySelector('header')).backgroundColor") \
                == "rgb(29, 35, 48)"
            cookie = next(c for c in page.context.cookies() if c["name"] == "sessionid")
            assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"

            # an endpoint at the verifying receiver
            page.click("text=Add an endpoint")
            page.fill("#url", hook)
            page.fill("#description", "our webhook handler")
            shot(page, "portal-endpoint-new")
            page.click("#create")
            expect(page.locator("h1")).to_have_text(hook)
            expect(page.locator("#health")).to_have_text("healthy")
            page.click("#reveal")
            secret = page.locator("#secret").inner_text().strip()
            assert secret.startswith("whsec_")
            shot(page, "portal-endpoint")

            # a test event, delivered and verified with the revealed secret
            page.click("#send-test")
            expect(page).to_have_url(re.compile(r"/portal/events/evt_"))
            expect(page.locator("h1")).to_contain_text("Event evt_")
            shot(page, "portal-event")
            page.locator("table a[href*='/portal/deliveries/dlv_']").first.click()
            wait_for_text(page, "#status", "succeeded")
            expect(page.locator("#attempts tr.attempt")).to_have_count(1)
            expect(page.locator("#attempts tr.attempt td").nth(3)).to_have_text("200")
            shot(page, "portal-delivery-succeeded")
            delivery_url = page.url

            # the receiver fails from now on; a resend is a second attempt, recorded with its 500
            receiver.script("/hook", *([500] * 10))
            page.click("#resend")
            expect(page.locator(".messages")).to_contain_text("Sent again")
            deadline = time.monotonic() + 30
            while page.locator("#attempts tr.attempt").count() < 2:
                assert time.monotonic() < deadline, "no second attempt within 30 s"
                time.sleep(0.5)
                page.reload()
            expect(page.locator("#attempts tr.attempt").nth(1).locator("td").nth(3)).to_have_text("500")
            shot(page, "portal-delivery-resent")

            # the deliveries list, filtered to this endpoint's test events
            page.goto(f"{base}/portal/deliveries?type=herald.test")
            expect(page.locator("table")).to_contain_text("herald.test")
            shot(page, "portal-deliveries")

            page.click("header >> text=Events")
            expect(page.locator("table")).to_contain_text("herald.test")
            shot(page, "portal-events")

            # rotating the secret: a new one shows when revealed
            page.goto(f"{base}/portal/")
            page.click(f"text={hook}")
            page.click("#rotate")
            expect(page.locator(".messages")).to_contain_text("new secret")
            page.click("#reveal")
            rotated = page.locator("#secret").inner_text().strip()
            assert rotated.startswith("whsec_") and rotated != secret

            # the endpoints page with its chart
            page.goto(f"{base}/portal/")
            expect(page.locator("table")).to_contain_text(hook)
            expect(page.locator("svg rect")).to_have_count(1)  # one delivery this hour (resent: no longer succeeded)
            shot(page, "portal-endpoints")

            # another tenant's delivery is not found; a used link is refused
            page.goto(f"{base}/portal/deliveries/{their_delivery}")
            expect(page.locator("h1")).to_have_text("Not found")
            shot(page, "portal-not-found")
            fresh = browser.new_page(viewport={"width": 1280, "height": 600})
            assert fresh.goto(base + link).status == 410
            expect(fresh.locator("h1")).to_have_text("This link cannot be used")
            shot(fresh, "portal-link-refused")

            # logging out ends the session
            page.goto(delivery_url)
            page.click("text=Log out")
            expect(page.locator("h1")).to_have_text("Signed out")
            page.goto(delivery_url)
            expect(page.locator("h1")).to_have_text("Your portal session has ended")
        finally:
            browser.close()

    for name in PAGES:
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 0, name
    assert blocked == []  # nothing of the portal's pages was refused by their policy
    # the expected refusals only: the not-found page and the page after logout
    assert sorted(status.split()[0] for status in broken) == ["403", "404"], broken
    # every request the receiver got was signed with the secret the portal revealed (before the rotation)
    requests = receiver.requests_to("/hook")
    assert len(requests) >= 2
    for request in requests:
        Webhook(secret).verify(request.body, request.headers)
