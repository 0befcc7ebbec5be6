"""The admin in a real headless Chromium against real gunicorn, worker, beat and receiver: an operator
finds a failed delivery, reads its attempts, retries it, and watches it succeed."""
import re
import time

import pytest

from tests.browser import CHROMIUM_ARGS, chromium_ready, herald  # noqa: F401 - herald is a fixture
from tests.conftest import make_api, wait_until
from tests.processes import ROOT
from webhooks.models import Delivery

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCREENSHOT = ROOT / "tests" / "artifacts" / "admin-delivery-succeeded.png"
USERNAME, PASSWORD = "ops", "correct-horse-battery-staple"


def test_an_operator_retries_a_failed_delivery_in_the_browser(herald, receiver, django_user_model):
    from playwright.sync_api import expect, sync_playwright

    chromium = chromium_ready()
    # All ORM work happens outside the Playwright block: its event loop makes Django refuse sync queries.
    django_user_model.objects.create_superuser(USERNAME, "ops@example.com", PASSWORD)
    api = make_api("acme")
    assert api.post("endpoints", {"url": receiver.url("/hook")}).status_code == 201
    receiver.script("/hook", 500, 503, 500, 502)  # the first attempt and three retries, then 200
    delivery_id = api.delivery_id("invoice.paid", {"invoice": "in_1"})
    wait_until(lambda: Delivery.objects.filter(pk=delivery_id, status=Delivery.FAILED).exists(), timeout=30,
               message="the delivery to fail after four attempts")

    base = herald.url
    change_url = f"{base}/admin/webhooks/delivery/{delivery_id}/change/"
    broken, blocked = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.on("response", lambda r: broken.append(f"{r.status} {r.url}")
                    if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
            # what the Content Security Policy blocked, as Chromium reports it (config/browser_headers.py)
            page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)

            page.goto(f"{base}/admin/login/?next=/admin/")
            page.fill("#id_username", USERNAME)
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            expect(page.locator("#site-name")).to_contain_text("Herald administration")

            # the failed deliveries, and this one among them
            page.goto(f"{base}/admin/webhooks/delivery/?status__exact=failed")
            row = page.locator("#result_list tbody tr", has_text=delivery_id)
            expect(row).to_have_count(1)
            expect(row.locator("td.field-status")).to_have_text("failed")

            # its page: four attempts, each with what the receiver answered
            row.locator("th.field-id a").click()
            expect(page).to_have_url(re.compile(r"/admin/webhooks/delivery/[^/]+/change/"))
            expect(page.locator(".field-id .readonly")).to_have_text(delivery_id)
            statuses = page.locator("#attempts-group td.field-response_status")
            expect(statuses).to_have_text(["500", "503", "500", "502"])
            expect(page.locator(".field-status .readonly")).to_have_text("failed")

            # back to the list, tick it, run the retry action
            page.go_back()
            page.check(f'input[name="_selected_action"][value="{delivery_id}"]')
            page.select_option('select[name="action"]', "retry_failed_deliveries")
            page.click('button[name="index"]')
            expect(page.locator("ul.messagelist")).to_contain_text("Retried 1 failed delivery")

            # the worker sends it again; the receiver now answers 200
            page.goto(change_url)
            deadline = time.monotonic() + 30
            while page.locator(".field-status .readonly").inner_text().strip() != "succeeded":
                assert time.monotonic() < deadline, "the retried delivery did not succeed within 30 s"
                time.sleep(0.5)
                page.reload()
            expect(statuses).to_have_text(["500", "503", "500", "502", "200"])
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
        finally:
            browser.close()

    assert SCREENSHOT.is_file() and SCREENSHOT.stat().st_size > 0
    assert broken == []  # every page and static file (whitenoise, through gunicorn) loaded
    assert blocked == []  # and nothing of the admin's pages was refused by their Content Security Policy
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.status == Delivery.SUCCEEDED and delivery.attempt_count == 5
    assert len(receiver.requests_to("/hook")) == 5
