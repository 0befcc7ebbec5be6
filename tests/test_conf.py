"""herald_settings (webhooks/conf.py): Herald's own settings, read in one place."""
import re
from pathlib import Path

from django.conf import settings as django_settings

from webhooks.conf import herald_settings

ROOT = Path(__file__).resolve().parent.parent
# webhooks/delivery/destinations/access.py still reads django.conf.settings itself (another change is under way in it).
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


def _lines_past_the_settings_module(pattern: re.Pattern) -> list[str]:
    """Lines of the app packages (not config/settings.py, not migrations) where `pattern` matches once every
    `herald_settings.` is taken out."""
    found = []
    for package in ("webhooks", "intake", "portal", "config"):
        for path in (ROOT / package).rglob("*.py"):
            relative = str(path.relative_to(ROOT))
            if relative == "config/settings.py" or "/migrations/" in relative:
                continue
            found += [f"{relative}: {line.strip()}" for line in path.read_text().splitlines()
                      if pattern.search(line.replace("herald_settings.", ""))]
    return found


def test_no_module_reads_a_herald_setting_past_herald_settings():
    names = "|".join(sorted(herald_settings.names()))
    pattern = re.compile(rf"\bsettings\.({names})\b|environ(\.get\(|\[)\"PROMETHEUS_MULTIPROC_DIR")
    assert _lines_past_the_settings_module(pattern) == []


def test_every_setting_read_from_the_environment_is_read_past_the_settings_module_only_through_herald_settings():
    """A variable config/settings.py reads from the environment (`NAME = env_…(`) that is not one of Django's own
    settings is read elsewhere only through herald_settings: one place, as every other Herald setting."""
    from django.conf import global_settings

    source = (ROOT / "config" / "settings.py").read_text()
    environment = set(re.findall(r"^([A-Z][A-Z0-9_]*) = env_\w+\(", source, flags=re.MULTILINE))
    own = sorted(name for name in environment if not hasattr(global_settings, name))
    assert "HERALD_TRUSTED_PROXIES" in own and "WEBHOOK_TIMEOUT_SECONDS" in own   # the scan finds them
    pattern = re.compile(rf"\bsettings\.({'|'.join(own)})\b|getattr\(settings, \"({'|'.join(own)})\"")
    assert _lines_past_the_settings_module(pattern) == []
