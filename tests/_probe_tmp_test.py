import webhooks.transport as t
from tests.test_transport import *  # noqa

def test_probe_without_watchdog(monkeypatch):
    monkeypatch.setattr(t._Deadline, "_watch", lambda self: None)
    test_drip_feeding_receiver_is_cut_off_by_the_whole_attempt_deadline()

def test_show(make_receiver):
    r = make_receiver(reply(200, b"ok"))
    for url, priv in [(r.url, False), (f"http://localhost:{r.port}/", False), ("http://127.0.0.1:1/", True), ("http://nonexistent.invalid/", True), ("not a url", True), ("ftp://x/", True)]:
        print(url, deliver(url, allow_private_networks=priv))
    def slow(call, receiver):
        receiver.release.wait(10); return 200, {}, b""
    s = make_receiver(slow)
    print(deliver(s.url))
