"""Request fingerprint: SHA-256 over method, path, sorted query and canonical JSON body (SPEC §3)."""
import hashlib
import json
from typing import Any
from urllib.parse import parse_qsl, urlencode


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no insignificant whitespace: `{"b": 2, "a": 1}` and `{"a":1,"b":2}` agree."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def request_fingerprint(*, method: str, path: str, query_string: str, body: bytes, parsed_body: Any = None,
                        body_is_json: bool = False) -> str:
    query = urlencode(sorted(parse_qsl(query_string, keep_blank_values=True)))
    canonical = canonical_json(parsed_body) if body_is_json else body
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode(), query.encode()):
        digest.update(part)
        digest.update(b"\n")
    digest.update(canonical)
    return digest.hexdigest()
