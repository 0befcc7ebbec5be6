"""Parse the `Idempotency-Key` header: a bare token or an RFC 8941 sf-string, 8–255 printable ASCII."""

MIN_LENGTH = 8
MAX_LENGTH = 255


class InvalidIdempotencyKey(ValueError):
    """The header is present but not a usable key."""


def parse_idempotency_key(raw: str) -> str:
    """Return the key the client meant, unquoting an sf-string; raise InvalidIdempotencyKey if it is not valid."""
    value = raw.strip(" \t")
    if value.startswith('"'):
        value = _unquote_sf_string(value)
    if not MIN_LENGTH <= len(value) <= MAX_LENGTH:
        raise InvalidIdempotencyKey(f"must be {MIN_LENGTH} to {MAX_LENGTH} characters long, not {len(value)}")
    if any(not " " <= ch <= "~" for ch in value):
        raise InvalidIdempotencyKey("must contain printable ASCII characters only")
    return value


def _unquote_sf_string(value: str) -> str:
    out = []
    i = 1
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            if i + 1 >= len(value) or value[i + 1] not in '"\\':
                raise InvalidIdempotencyKey("has an invalid escape in its quoted string")
            out.append(value[i + 1])
            i += 2
            continue
        if ch == '"':
            if i != len(value) - 1:
                raise InvalidIdempotencyKey("has characters after its quoted string (send the header once)")
            return "".join(out)
        out.append(ch)
        i += 1
    raise InvalidIdempotencyKey("has an unterminated quoted string")
