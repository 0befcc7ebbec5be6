"""Bad input for the intake: hypothesis strategies, a raw HTTP sender, and a model of the pre-view rejections."""
from __future__ import annotations

import http.client
import json
import string
import threading
from dataclasses import dataclass, field

from hypothesis import strategies as st

PATH = "/api/v1/events"
PRE_VIEW_CODES = frozenset({"not_authenticated", "idempotency_key_missing", "idempotency_key_invalid",
                            "payload_too_large", "unsupported_media_type"})
RESERVED_HEADERS = frozenset({"authorization", "idempotency-key", "content-type", "content-length", "host",
                              "transfer-encoding", "connection", "expect", "x-request-id", "upgrade", "te",
                              "trailer", "keep-alive", "proxy-connection"})


@dataclass(frozen=True)
class FuzzInput:
    """One generated request; the key is built at send time so valid keys never collide between examples."""

    auth_kind: str  # valid | valid_lowercase | missing | wrong | ambiguous
    auth: str | None
    key_kind: str  # valid | quoted | spaced | short | long | non_ascii | control | quoted_broken | missing | empty
    key_part: str | None
    content_type: str | None
    body_kind: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    depth: int = 0  # nesting depth of deep bodies (the harness's own json parser is not a model beyond ~500)


@dataclass
class FuzzRecord:
    inp: FuzzInput
    key_header: bytes | None
    key_candidates: tuple[str, ...]
    request_id: str
    status: int | None = None
    code: str = ""
    detail: str = ""
    has_errors_field: bool = False
    body: bytes = b""
    error: str = ""
    replay: bool = False
    answer_type: str = ""  # the response's Content-Type
    expected: str = "?"
    problems: list[str] = field(default_factory=list)

    @property
    def answered_by_gunicorn(self) -> bool:
        """The HTTP server refused the request before Django saw it: a 400 without problem+json, or the web
        worker's reader's `malformed_request` (llhttp's strict mode: config/http_reader.py)."""
        return self.status == 400 and self.code in ("", "malformed_request")

    @property
    def rejected_before_view(self) -> bool:
        if self.answered_by_gunicorn:
            return True
        if self.code in PRE_VIEW_CODES:
            return True
        return self.status == 400 and self.code == "validation_error" and not self.has_errors_field


# ---------------------------------------------------------------- the contract's pre-view checks, as a model


def sf_unquote(value: str) -> str | None:
    """RFC 8941 sf-string: printable ASCII in double quotes, escapes only \\\" and \\\\; None if malformed."""
    if len(value) < 2 or not value.startswith('"') or not value.endswith('"'):
        return None
    out, i, inner = [], 0, value[1:-1]
    while i < len(inner):
        ch = inner[i]
        if ch == "\\":
            if i + 1 >= len(inner) or inner[i + 1] not in '"\\':
                return None
            out.append(inner[i + 1])
            i += 2
            continue
        if ch == '"':
            return None
        out.append(ch)
        i += 1
    return "".join(out)


def model_key(raw: bytes | None) -> tuple[str, str | None]:
    """('missing'|'invalid'|'valid', the key Herald should store)."""
    if raw is None:
        return "missing", None
    value = raw.decode("latin-1").strip(" \t")
    if value.startswith('"'):
        unquoted = sf_unquote(value)
        if unquoted is None:
            return "invalid", None
        value = unquoted
    if not 8 <= len(value) <= 255 or any(not " " <= ch <= "~" for ch in value):
        return "invalid", None
    return "valid", value


def model_body(inp: FuzzInput, limit: int) -> str:
    """'payload_too_large' | 'unsupported_media_type' | 'malformed' | 'view' | '?' for a body past auth and key."""
    if len(inp.body) > limit:
        return "payload_too_large"
    if not inp.body:
        return "view"
    media = (inp.content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        # SPEC §3 leaves other JSON types (application/*+json) to Herald: refusing them (415, never stored)
        # and accepting them are both fair; that a refusal is never stored is checked on every request
        return "?" if media.endswith("+json") else "unsupported_media_type"
    if inp.depth > 500:
        return "?"  # Python's recursion limit decides; the harness's stack is not Herald's
    try:
        value = json.loads(inp.body.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "malformed"
    if _unrepresentable(value):
        return "?"  # valid JSON, but not storable text: a 400 before or from the view are both fair (never a 5xx)
    return "view"


def _no_constants(name):
    raise ValueError(name)


def _unrepresentable(value) -> bool:
    """True if a string (or key) holds U+0000 or a lone surrogate: JSON allows them, UTF-8 and jsonb do not."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                return True
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def expected_outcome(inp: FuzzInput, key_header: bytes | None, limit: int) -> str:
    """What SPEC §3 says comes first: authentication, then the key, then size, media type and JSON. A body
    over the limit may instead be refused by the web server before it is read, before any other check
    (config/gunicorn_worker.py): "…|payload_too_large" accepts either."""
    expected = _expected_in_order(inp, key_header, limit)
    if len(inp.body) > limit and expected in ("not_authenticated", "idempotency_key_missing", "idempotency_key_invalid"):
        return f"{expected}|payload_too_large"
    return expected


def _expected_in_order(inp: FuzzInput, key_header: bytes | None, limit: int) -> str:
    if inp.auth_kind in ("missing", "wrong"):
        return "not_authenticated"
    if inp.auth_kind not in ("valid", "valid_lowercase"):
        return "?"
    key_state, _ = model_key(key_header)
    if key_state == "missing":
        return "idempotency_key_missing"
    if key_state == "invalid":
        return "idempotency_key_invalid"
    return model_body(inp, limit)


def odd_header_bytes(record: FuzzRecord) -> bool:
    """A header value outside printable ASCII (HTTP servers may refuse those: gunicorn answers 400 itself)."""
    values = [record.key_header or b""] + [value.encode("latin-1") for _, value in record.inp.headers]
    return any(not (0x20 <= byte <= 0x7E or byte == 0x09) for value in values for byte in value)


def outcome_matches(expected: str, record: FuzzRecord) -> bool:
    if "|" in expected:
        return any(outcome_matches(alternative, record) for alternative in expected.split("|"))
    if record.answered_by_gunicorn:
        # the HTTP server refused the request before Django saw it (never stored, never executed: checked
        # separately); fair for odd header bytes, a deviation for a plain request
        return odd_header_bytes(record) or expected not in ("view", "?")
    if expected == "?":
        return True
    if expected == "not_authenticated":
        return record.status == 401 and record.code == "not_authenticated"
    if expected in ("idempotency_key_missing", "idempotency_key_invalid"):
        return record.status == 400 and record.code == expected
    if expected == "payload_too_large":
        return record.status == 413
    if expected == "unsupported_media_type":
        return record.status == 415
    if expected == "malformed":
        return record.status == 400 and record.code == "validation_error" and not record.has_errors_field
    if expected == "view":
        return not record.rejected_before_view
    return True


# ---------------------------------------------------------------- strategies

_PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
_TOKEN_CHARS = string.ascii_letters + string.digits + "-"
_SPECIAL_STRINGS = ["\x00", "a\x00b", "\ud800", "\udfff", "x\udc80y", "\u2028", "\ufeff", "é", "🙂", "\\", '"',
                    "\x7f", "\u0085", "A" * 5000]
_SPECIAL_NUMBERS = ["1e400", "-1e400", "1e-400", "-0", "0.1e1", "1" * 4300, "1" * 4301, "9" * 40,
                    "NaN", "Infinity", "-Infinity", "1.5E+308"]
_VALID_TYPES = st.from_regex(r"\A[A-Za-z0-9_]{1,12}(\.[A-Za-z0-9_]{1,12}){0,3}\Z")


def _text(plain: bool, max_size: int):
    """Any text; `plain` leaves out U+0000 (so that one known bug does not mask the rest)."""
    if plain:
        return st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                       max_size=max_size)
    return st.text(max_size=max_size)


def _scalars(plain: bool):
    return (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
            | _text(plain, 30))


def json_values(plain: bool = True):
    return st.recursive(_scalars(plain),
                        lambda children: st.lists(children, max_size=5)
                        | st.dictionaries(_text(plain, 12), children, max_size=5),
                        max_leaves=25)


def _encode(text: str, encoding: str) -> bytes:
    return text.encode(encoding, errors="surrogatepass")


def _event_document(draw) -> dict:
    document = {"type": draw(_VALID_TYPES), "data": draw(json_values(plain=True))}
    if draw(st.integers(0, 4)) == 0:
        document["type"] = draw(st.text(max_size=20))  # often not a valid type: the view's own 400
    if draw(st.integers(0, 4)) == 0:
        document["channels"] = draw(st.lists(st.text(max_size=10), max_size=3))
    if draw(st.integers(0, 9)) == 0:
        document["extra"] = draw(json_values())
    return document


def _deep(depth: int, shape: str, wrapped: bool) -> bytes:
    inner = "[" * depth + "]" * depth if shape == "list" else '{"a":' * depth + "1" + "}" * depth
    return (f'{{"type":"fuzz.deep","data":{inner}}}' if wrapped else inner).encode()


@st.composite
def event_bodies(draw, valid: bool, limit: int) -> tuple[str, bytes, int]:
    """(kind, body, nesting depth). `valid`: well-formed JSON under the size limit (exotic content allowed)."""
    if valid:
        kind = draw(st.sampled_from(["event", "event", "event", "special", "special", "deep", "deep_edge",
                                     "huge"]))
    else:
        kind = draw(st.sampled_from(["random_json", "bytes", "deep_big", "huge_over", "empty", "truncated",
                                     "encoding"]))
    if kind == "event":
        text = json.dumps(_event_document(draw), ensure_ascii=draw(st.booleans()),
                          indent=draw(st.sampled_from([None, None, 2])))
        return kind, text.encode("utf-8"), 0
    if kind in ("encoding", "truncated"):
        text = json.dumps(_event_document(draw), ensure_ascii=draw(st.booleans()))
        if kind == "truncated":
            raw = text.encode("utf-8")
            return kind, raw[:draw(st.integers(0, max(0, len(raw) - 1)))], 0
        encoding = draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32", "latin-1", "utf-8-sig", "cp1252"]))
        return f"encoding:{encoding}", text.encode(encoding, errors="replace"), 0
    if kind == "special":
        where = draw(st.sampled_from(["string", "string", "number", "key"]))
        if where == "number":
            literal = draw(st.sampled_from(_SPECIAL_NUMBERS))
            return f"special:number:{literal[:12]}", f'{{"type":"fuzz.special","data":{{"n":{literal}}}}}'.encode(), 0
        value = draw(st.sampled_from(_SPECIAL_STRINGS))
        # json.dumps escapes \x00 and surrogates as \u0000 / \ud800, which is how a client would send them
        data = {value: 1} if where == "key" else {"s": value}
        return (f"special:{where}:{value[:6].encode('unicode_escape').decode()}",
                json.dumps({"type": "fuzz.special", "data": data}).encode(), 0)
    if kind == "random_json":
        return kind, json.dumps(draw(json_values(plain=False))).encode(), 0
    if kind == "bytes":
        return kind, draw(st.binary(max_size=2000)), 0
    if kind in ("deep", "deep_edge", "deep_big"):
        depth = draw({"deep": st.integers(1, 400), "deep_edge": st.integers(800, 1100),
                      "deep_big": st.sampled_from([2000, 5000, 100000])}[kind])
        shape = draw(st.sampled_from(["list", "dict"]))
        return f"{kind}:{shape}", _deep(depth, shape, wrapped=kind != "deep_big" or draw(st.booleans())), depth
    if kind in ("huge", "huge_over"):
        sizes = [limit - 1, limit] if kind == "huge" else [limit + 1, limit + 1024, 2 * limit]
        size = draw(st.sampled_from(sizes))
        return f"huge:{size - limit:+d}", sized_body(size), 0
    return kind, b"", 0


def sized_body(size: int) -> bytes:
    """A valid event of exactly `size` bytes (at least ~45)."""
    head, tail = b'{"type":"fuzz.huge","data":{"pad":"', b'"}}'
    return head + b"x" * max(0, size - len(head) - len(tail)) + tail


_GOOD_AUTH = ["valid", "valid", "valid", "valid", "valid_lowercase"]
_BAD_AUTH = ["missing", "wrong", "wrong_scheme", "wrong_random", "truncated", "too_long", "ambiguous_space",
             "ambiguous_extra", "empty_bearer"]
_GOOD_KEYS = ["valid", "valid", "valid", "quoted", "spaced"]
_BAD_KEYS = ["short", "long", "non_ascii", "control", "quoted_broken", "missing", "empty"]
_GOOD_TYPES = ["application/json", "application/json", "application/json; charset=utf-8",
               "application/json; charset=utf-16", "APPLICATION/JSON", "application/vnd.herald+json",
               "application/problem+json"]
_BAD_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz", "", None,
              "application/jsonx", "json", "application/json-seq", "text/json"]


def _auth(kind: str, token: str, draw) -> tuple[str, str | None]:
    return {
        "valid": ("valid", f"Bearer {token}"),
        "valid_lowercase": ("valid_lowercase", f"bearer {token}"),
        "missing": ("missing", None),
        "wrong": ("wrong", f"Bearer {token}x"),
        "wrong_scheme": ("wrong", draw(st.sampled_from([f"Token {token}", "Basic dXNlcjpwYXNzd29yZA==", token]))),
        "wrong_random": ("wrong", "Bearer " + draw(st.text(alphabet=_TOKEN_CHARS, min_size=1, max_size=60))),
        "truncated": ("wrong", f"Bearer {token[:-1]}"),
        "too_long": ("wrong", "Bearer " + "A" * 201),
        "empty_bearer": ("wrong", draw(st.sampled_from(["Bearer", "Bearer ", ""]))),
        "ambiguous_space": ("ambiguous", f"Bearer  {token}"),
        "ambiguous_extra": ("ambiguous", f"Bearer {token} extra"),
    }[kind]


def _key_part(kind: str, draw) -> str | None:
    if kind in ("valid", "quoted", "spaced"):
        return draw(st.text(alphabet=_PRINTABLE, max_size=40))
    if kind == "short":
        return draw(st.text(alphabet=_PRINTABLE, max_size=7))
    if kind == "long":
        return draw(st.text(alphabet=_PRINTABLE, min_size=256, max_size=300))
    if kind == "non_ascii":
        return draw(st.text(min_size=4, max_size=30).filter(lambda s: "\r" not in s and "\n" not in s)) + "é🙂"
    if kind == "control":
        return "key-" + draw(st.sampled_from(["\x01", "\x07", "\x1b", "\x7f", "\t\x0b"])) + "-control"
    if kind == "quoted_broken":
        return draw(st.sampled_from(['"unterminated-key', '"bad\\escape-key"', '"quoted"trailing-junk', '""',
                                     '"short"']))
    return None


@st.composite
def fuzz_inputs(draw, token: str, limit: int) -> FuzzInput:
    """A request with up to two of its parts broken (auth, key, media type, body); the rest is well-formed."""
    broken = draw(st.sets(st.sampled_from(["auth", "key", "content_type", "body"]), max_size=2))
    auth_kind, auth = _auth(draw(st.sampled_from(_BAD_AUTH if "auth" in broken else _GOOD_AUTH)), token, draw)
    key_kind = draw(st.sampled_from(_BAD_KEYS if "key" in broken else _GOOD_KEYS))
    content_type = draw(st.sampled_from(_BAD_TYPES if "content_type" in broken else _GOOD_TYPES))
    body_kind, body, depth = draw(event_bodies(valid="body" not in broken, limit=limit))
    names = st.text(alphabet=_TOKEN_CHARS, min_size=1, max_size=20).filter(lambda n: n.lower() not in RESERVED_HEADERS)
    values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=60)
    headers = tuple(draw(st.lists(st.tuples(names, values), max_size=3)))
    return FuzzInput(auth_kind, auth, key_kind, _key_part(key_kind, draw), content_type, body_kind, body, headers,
                     depth)


# ---------------------------------------------------------------- sending


class Nonces:
    def __init__(self, run_id: str):
        self.run_id = run_id
        self._n = 0
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            self._n += 1
            return f"-bbf{self._n:06d}{self.run_id}"


def build_key(inp: FuzzInput, nonce: str) -> tuple[bytes | None, tuple[str, ...]]:
    """The Idempotency-Key header bytes and every form of it that Herald could have stored."""
    part = inp.key_part
    if inp.key_kind == "missing":
        return None, ()
    if inp.key_kind == "empty":
        return b"", ("",)
    if inp.key_kind == "valid":
        key = part + nonce
        return key.encode(), (key, key.strip(" \t"))
    if inp.key_kind == "quoted":
        key = part + nonce
        escaped = key.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'.encode(), (key, f'"{escaped}"')
    if inp.key_kind == "spaced":
        key = part + nonce
        return f"  {key}\t".encode(), (key, key.strip(" \t"))
    if inp.key_kind == "non_ascii":
        return part.encode("utf-8"), (part, part.encode("utf-8").decode("latin-1"))
    return part.encode("latin-1"), (part, part.strip(" \t"))


def send(host: str, port: int, inp: FuzzInput, nonce: str, request_id: str, timeout: float = 30) -> FuzzRecord:
    key_header, candidates = build_key(inp, nonce)
    record = FuzzRecord(inp=inp, key_header=key_header, key_candidates=candidates, request_id=request_id)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.putrequest("POST", PATH, skip_accept_encoding=True)
        if inp.auth is not None:
            conn.putheader("Authorization", inp.auth)
        if key_header is not None:
            conn.putheader("Idempotency-Key", key_header)
        if inp.content_type is not None:
            conn.putheader("Content-Type", inp.content_type)
        conn.putheader("X-Request-Id", request_id)
        for name, value in inp.headers:
            conn.putheader(name, value.encode("latin-1"))
        conn.putheader("Content-Length", str(len(inp.body)))
        try:
            conn.endheaders(inp.body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (413) and close before reading everything: read its answer below
        response = conn.getresponse()
        record.status = response.status
        record.body = response.read(4 * 1024 * 1024)
        record.replay = response.getheader("Idempotent-Replay") == "true"
        record.answer_type = response.getheader("Content-Type") or ""
        if record.answer_type.startswith("application/problem+json"):
            try:
                problem = json.loads(record.body)
                record.code = str(problem.get("code", ""))
                record.detail = str(problem.get("detail", ""))[:200]
                record.has_errors_field = "errors" in problem
            except ValueError:
                pass
    except ValueError as exc:  # http.client refused to send it (an illegal header value): not a request
        record.error = f"not sent: {exc}"
    except (OSError, http.client.HTTPException) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return record
