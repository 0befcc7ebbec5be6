"""Prefixed, time-ordered identifiers (`evt_01J…`): ULIDs, so sorting by id sorts by creation."""
import os
import threading
import time
from datetime import datetime, timezone

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
_RANDOM_BITS = 80
_last = 0
_lock = threading.Lock()


def _forget_after_fork() -> None:
    global _last, _lock
    _last, _lock = 0, threading.Lock()  # two forked children must not both continue from the parent's last id


os.register_at_fork(after_in_child=_forget_after_fork)


def new_id(prefix: str) -> str:
    """Return `prefix_` + a 26-character ULID (48-bit ms timestamp, 80 random bits).

    Monotonic within a process (the ULID spec's monotonic variant): within one millisecond the next
    id is the previous one plus one, so two events created one after the other are ordered as they
    were created even then, which a fifo endpoint's delivery order relies on.
    """
    global _last
    value = (time.time_ns() // 1_000_000) << _RANDOM_BITS | int.from_bytes(os.urandom(10), "big")
    with _lock:
        if value >> _RANDOM_BITS <= _last >> _RANDOM_BITS:
            value = _last + 1
        _last = value
    return f"{prefix}_{_encode(value)}"


def _encode(value: int) -> str:
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def boundary(prefix: str, when) -> str:
    """The smallest id `prefix` can have for something created at `when` (an aware datetime): every id
    made before it sorts lower."""
    return f"{prefix}_{_encode(int(when.timestamp() * 1000) << _RANDOM_BITS)}"


def time_of(value: str) -> datetime:
    """When an id was made (or the time a `boundary` stands for): its ULID's millisecond time, UTC."""
    ms = 0
    for char in value.split("_", 1)[1][:10]:
        ms = ms * 32 + _ALPHABET.index(char)
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def made_at(prefix: str, when) -> str:
    """An id `prefix` as one made at `when` would be (its random part random): history written after the fact,
    a test's or a bench's rows of another day."""
    return f"{prefix}_{_encode(int(when.timestamp() * 1000) << _RANDOM_BITS | int.from_bytes(os.urandom(10), 'big'))}"


# Named factories, because migrations can serialise functions but not lambdas.
def tenant_id() -> str:
    # `tnt_` (SPEC §10); tenants made before it keep their `ten_` ids, which are found by id all the same.
    return new_id("tnt")


def endpoint_id() -> str:
    return new_id("ep")


def event_id() -> str:
    return new_id("evt")


def delivery_id() -> str:
    return new_id("dlv")


def event_type_id() -> str:
    return new_id("etype")


def recovery_id() -> str:
    return new_id("rcv")
