"""Prefixed, time-ordered identifiers (`evt_01J…`): ULIDs, so sorting by id sorts by creation."""
import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32


def new_id(prefix: str) -> str:
    """Return `prefix_` + a 26-character ULID (48-bit ms timestamp, 80 random bits)."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


# Named factories, because migrations can serialise functions but not lambdas.
def tenant_id() -> str:
    return new_id("ten")


def endpoint_id() -> str:
    return new_id("ep")


def event_id() -> str:
    return new_id("evt")


def delivery_id() -> str:
    return new_id("dlv")
