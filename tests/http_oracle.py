"""The differential check of the buffered worker's reader (config/http_reader.py, llhttp) against gunicorn's own
parser, which reads the same bytes in the thread: on every input, either ours refuses, or both agree on each
request (method, target, body) and on where the last one ends. Used by tests/test_http_reader.py (generated
requests) and tests/fuzz_http_reader.py (atheris, coverage-guided)."""
from __future__ import annotations

from dataclasses import dataclass

from gunicorn.config import Config
from gunicorn.http.errors import NoMoreData, ParseException
from gunicorn.http.parser import RequestParser

from config.http_reader import Refusal, RequestReader

MAX_HEAD, MAX_BODY = 16384, 262144   # the defaults of WEB_MAX_HEADER_BYTES and INTAKE_MAX_BODY_BYTES
_CONFIG = Config()


class Disagreement(AssertionError):
    pass


class RecordingReader(RequestReader):
    """Our reader, keeping what llhttp reported of each request: the target and the decoded body."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests: list[list] = []

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.requests.append([b"", bytearray()])

    def on_url(self, url: bytes) -> None:
        self.requests[-1][0] += url

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self.requests[-1][1] += body


@dataclass
class Verdict:
    outcome: str                              # "whole" (every byte served), "incomplete" or "refused"
    requests: list[tuple[str, bytes]]         # (target, body) of each request handed to gunicorn
    status: int | None = None                 # of the refusal
    gunicorn_refused: bool = False            # gunicorn's parser answered 400 to bytes llhttp found whole


def check(data: bytes, splits: list[int] = ()) -> Verdict:
    """Read `data` as the worker does, in pieces cut at `splits` as recv() could hand them over: our reader until
    it finds whole requests, then gunicorn's parser over exactly those bytes, whatever it leaves read again by a
    fresh reader first. Raise Disagreement where gunicorn reads the handed bytes otherwise than llhttp did."""
    cuts = sorted({0, len(data), *(s for s in splits if 0 < s < len(data))})
    pieces = [data[start:end] for start, end in zip(cuts, cuts[1:])]
    served: list[tuple[str, bytes]] = []
    reader, buf = RecordingReader(MAX_HEAD, MAX_BODY), b""
    while pieces:
        piece = pieces.pop(0)
        buf += piece
        try:
            whole = reader.feed(piece)
        except Refusal as refusal:
            return Verdict("refused", served, refusal.status)
        if not whole:
            continue
        mine = [(url.decode("latin-1"), bytes(body)) for url, body in reader.requests]
        theirs, how, left = gunicorns(buf, len(mine))
        if theirs != mine[:len(theirs)]:
            raise Disagreement(f"llhttp read {mine!r}, gunicorn {theirs!r} in {buf!r}")
        if how == "refused":
            return Verdict("refused", served + theirs, 400, gunicorn_refused=True)
        if how == "closed":
            return Verdict("whole", served + theirs)   # the connection ends after the last request gunicorn read
        if how == "needs-more":
            raise Disagreement(f"gunicorn would wait on the socket for more of what llhttp found whole: {buf!r}")
        if theirs != mine:
            raise Disagreement(f"llhttp read {mine!r}, gunicorn {theirs!r} in {buf!r}")
        if left.strip(b"\r\n") and not (reader.upgrade or reader.closes):   # llhttp stopped early: the rest is re-read
            raise Disagreement(f"gunicorn finds {left!r} after what llhttp found whole in {buf!r}")
        served += mine
        if left:
            pieces.insert(0, left)   # what the worker reads again (take_buffered) before the socket
        reader, buf = RecordingReader(MAX_HEAD, MAX_BODY), b""
    return Verdict("whole" if not buf else "incomplete", served)


def gunicorns(data: bytes, count: int) -> tuple[list[tuple[str, bytes]], str, bytes]:
    """gunicorn's parser over `data` in memory: up to `count` requests, how it stopped ("done"; "closed": a request
    ended the connection; "needs-more": it would wait on the socket; "refused"), and the bytes it left."""
    parser = RequestParser(_CONFIG, iter([data]), ("127.0.0.1", 5000))
    requests = []
    try:
        while len(requests) < count:
            req = next(parser)
            requests.append((req.uri, req.body.read()))
    except NoMoreData:
        return requests, "needs-more", b""
    except StopIteration:
        if parser.mesg is not None and parser.mesg.should_close():
            return requests, "closed", b""   # HTTP/1.0 or `Connection: close`: gunicorn reads no further
        return requests, "needs-more", b""
    except ParseException:   # gunicorn's parser refuses it (its own error classes: a 4xx/5xx in the thread);
        # anything else raised here is a bug (in gunicorn or in this oracle) and fails the test
        return requests, "refused", b""
    if parser.mesg.should_close():
        return requests, "closed", b""
    left = parser.unreader.take_buffered() + b"".join(iter(parser.unreader.chunk, b""))
    return requests, "done", left
