"""herald_settings (webhooks/conf.py): Herald's own settings, read in one place."""
import re
from pathlib import Path

from django.conf import settings as django_settings

from webhooks.conf import herald_settings

ROOT = Path(__file__).resolve().parent.parent
# webhooks/access.py still reads django.conf.settings itself (another change is under way in it).
NOT_YET = {"webhooks/access.py"}


def test_every_herald_setting_is_defined_by_the_settings_module():
    missing = [name for name in herald_settings.names() if not hasattr(django_settings, name)]
    assert missing == []


def test_a_changed_setting_is_seen_at_once(settings):
    before = herald_settings.queues.WEBHOOK_ENQUEUE_CHUNK  # read, and kept
    settings.WEBHOOK_ENQUEUE_CHUNK = before + 7
    assert herald_settings.queues.WEBHOOK_ENQUEUE_CHUNK == before + 7
    settings.HERALD_PERIODIC_QUEUE = "elsewhere"
    assert herald_settings.queues.retries == "elsewhere"
    settings.WEBHOOK_ENQUEUE_CHUNK = before  # as pytest-django does after the test: sends setting_changed
    assert herald_settings.queues.WEBHOOK_ENQUEUE_CHUNK == before


def test_no_module_reads_a_herald_setting_past_herald_settings():
    names = "|".join(sorted(herald_settings.names()))
    pattern = re.compile(rf"\bsettings\.({names})\b|environ(\.get\(|\[)\"PROMETHEUS_MULTIPROC_DIR")
    found = []
    for package in ("webhooks", "intake", "portal", "config"):
        for path in (ROOT / package).rglob("*.py"):
            relative = str(path.relative_to(ROOT))
            if relative in NOT_YET or relative == "config/settings.py" or "/migrations/" in relative:
                continue
            found += [f"{relative}: {line.strip()}" for line in path.read_text().splitlines()
                      if pattern.search(line.replace("herald_settings.", ""))]
    assert found == []
