"""Endpoint payload filters (SPEC §15): checked and compiled, once, into a PostgreSQL jsonpath predicate.

A filter is null or a JSON object matched against the event's `{type, data, channels}`. Keys address
fields by nesting (`{"data": {"amount": {"$gte": 1000}}}`); a plain scalar is equality, and on an array
field membership (jsonpath's lax mode unwraps arrays, at every step of a path too). Operators: `$eq`,
`$neq`, `$in`, `$nin`, `$gt`, `$gte`, `$lt`, `$lte`, `$exists`, `$startsWith` (on the field they sit
under), `$and`, `$or` (a list of conditions), `$not` (a condition). Several keys in one object must all
hold. (jsonpath's lax mode unwraps an array at each step of a path, and up to two levels of arrays at the
compared value: `{"x": 1}` matches `"x": [[1]]` too.) A comparison between values of different types (a string `$gt` a number) does not hold; `$neq` and
`$nin` hold on a missing field.

Why jsonpath: the fan-out is one SQL statement in the intake transaction (webhooks/services/events.py);
evaluating the filters there (`event @@ endpoint.filter_path`) keeps it one round trip. The filter is
compiled when it is written (an endpoint's `filter_path` column), so intake never parses one; the
compilation is cached by the filter's digest. Each comparison is a jsonpath filter inside `exists(...)`,
which makes it two-valued (jsonpath's "unknown", from comparing a string with a number, counts as no
match), so `$not`, `$and` and `$or` are plain boolean logic.

Bounds, so that no filter can slow intake: at most FILTER_MAX_BYTES of compact JSON, FILTER_MAX_DEPTH
levels of nesting, FILTER_MAX_LIST values in an `$in`/`$nin`/`$and`/`$or`. A filter sees only the event
it is matched against: the document holds nothing else, and the top level takes only `type`, `data`
and `channels`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Any

FILTER_MAX_BYTES = 4096
FILTER_MAX_DEPTH = 8
FILTER_MAX_LIST = 100
TOP_LEVEL = ("type", "data", "channels")
COMPARISONS = {"$eq": "==", "$neq": "!=", "$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
OPERATORS = frozenset({*COMPARISONS, "$in", "$nin", "$exists", "$startsWith", "$and", "$or", "$not"})


class FilterInvalid(ValueError):
    """A filter that cannot be used; `pointer` is the JSON pointer of the offending part (`/data/amount/$gt`)."""

    def __init__(self, pointer: str, message: str) -> None:
        super().__init__(message)
        self.pointer = pointer


def canonical(value: Any) -> str:
    """The filter's compact JSON, keys sorted: what its size is measured on and its digest taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def filter_compile(value: Any) -> str | None:
    """The jsonpath predicate of a filter (None for null); FilterInvalid says what is wrong and where."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise FilterInvalid("", "A filter is null or a JSON object.")
    try:
        text = canonical(value)
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise FilterInvalid("", "A string in a filter may not hold an unpaired surrogate (\\ud800).") from None
    except (ValueError, TypeError, RecursionError):
        raise FilterInvalid("", "A filter is plain JSON (no NaN or Infinity).") from None
    if size > FILTER_MAX_BYTES:
        raise FilterInvalid("", f"A filter is at most {FILTER_MAX_BYTES} bytes of JSON.")
    return _compiled(hashlib.sha256(text.encode("utf-8")).hexdigest(), text)


@functools.lru_cache(maxsize=1024)
def _compiled(digest: str, text: str) -> str:
    # Keyed by the digest (the text rides along to be parsed on a miss): the same filter on many endpoints,
    # or written again, is compiled once per process.
    return _Compiler().top(json.loads(text))


def _pointer_part(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _string(value: str, pointer: str) -> str:
    if "\x00" in value:
        raise FilterInvalid(pointer, "A string in a filter may not contain NUL (\\u0000).")
    # A JSON string literal is a jsonpath string literal (the same escapes); non-ASCII goes as it is.
    return json.dumps(value, ensure_ascii=False)


def _not(predicate: str) -> str:
    # jsonpath's `!` takes a parenthesised predicate only (`!!exists(…)` is a syntax error)
    return f"!({predicate})"


class _Compiler:
    def top(self, value: dict, prefix: str = "", depth: int = 0) -> str:
        """The condition on the whole event (the filter itself, or one under a top-level $and/$or/$not)."""
        parts = []
        for key, condition in value.items():
            pointer = f"{prefix}/{_pointer_part(key)}"
            if key in ("$and", "$or", "$not"):
                parts.append(self.logical(key, condition, "$", pointer, depth + 1, top=True))
            elif key.startswith("$"):
                raise FilterInvalid(pointer, f"{key} cannot stand at the top of a filter: it needs a field "
                                             f"({', '.join(TOP_LEVEL)}).")
            elif key not in TOP_LEVEL:
                raise FilterInvalid(pointer, f"A filter matches the event's {', '.join(TOP_LEVEL)}; not {key!r}.")
            else:
                parts.append(self.field("$." + _string(key, pointer), condition, pointer, depth + 1))
        return self.all(parts)

    @staticmethod
    def all(parts: list[str]) -> str:
        if not parts:
            return "exists($)"  # an empty condition holds
        return parts[0] if len(parts) == 1 else "(" + " && ".join(parts) + ")"

    def depth_check(self, depth: int, pointer: str) -> None:
        if depth > FILTER_MAX_DEPTH:
            raise FilterInvalid(pointer, f"A filter nests at most {FILTER_MAX_DEPTH} levels.")

    def field(self, path: str, condition: Any, pointer: str, depth: int) -> str:
        """The condition on the field at `path`: an object of operators and sub-fields, or a plain value."""
        self.depth_check(depth, pointer)
        if not isinstance(condition, dict):
            return self.compare(path, "==", condition, pointer)
        parts = []
        for key, sub in condition.items():
            sub_pointer = f"{pointer}/{_pointer_part(key)}"
            if key.startswith("$"):
                parts.append(self.operator(path, key, sub, sub_pointer, depth))
            else:
                parts.append(self.field(f"{path}.{_string(key, sub_pointer)}", sub, sub_pointer, depth + 1))
        return self.all(parts)

    def scalar(self, value: Any, pointer: str, *, ordered: bool = False) -> str:
        if isinstance(value, str):
            return _string(value, pointer)
        if ordered and (value is None or isinstance(value, bool)):
            raise FilterInvalid(pointer, "Compare a number or a string.")
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            if abs(value) > 10**38:
                raise FilterInvalid(pointer, "A number in a filter is at most 1e38.")
            return str(value)
        if isinstance(value, float):
            if not math.isfinite(value) or abs(value) > 1e38:
                raise FilterInvalid(pointer, "A number in a filter is finite and at most 1e38.")
            return repr(value)
        raise FilterInvalid(pointer, "Expected a string, number, boolean or null (to match arrays, use $in; "
                                     "to address nested fields, an object).")

    def compare(self, path: str, op: str, value: Any, pointer: str) -> str:
        if op == "!=":
            return _not(self.compare(path, "==", value, pointer))
        literal = self.scalar(value, pointer, ordered=op not in ("==",))
        return f"exists({path} ? (@ {op} {literal}))"

    def operator(self, path: str, key: str, value: Any, pointer: str, depth: int) -> str:
        if key in COMPARISONS:
            return self.compare(path, COMPARISONS[key], value, pointer)
        if key in ("$in", "$nin"):
            if not isinstance(value, list):
                raise FilterInvalid(pointer, f"{key} takes a list of values.")
            if len(value) > FILTER_MAX_LIST:
                raise FilterInvalid(pointer, f"{key} takes at most {FILTER_MAX_LIST} values.")
            literals = [self.scalar(item, f"{pointer}/{index}") for index, item in enumerate(value)]
            found = (f"exists({path} ? ({' || '.join(f'@ == {literal}' for literal in literals)}))"
                     if literals else _not("exists($)"))
            return found if key == "$in" else _not(found)
        if key == "$exists":
            if not isinstance(value, bool):
                raise FilterInvalid(pointer, "$exists takes true or false.")
            return f"exists({path})" if value else _not(f"exists({path})")
        if key == "$startsWith":
            if not isinstance(value, str):
                raise FilterInvalid(pointer, "$startsWith takes a string.")
            return f"exists({path} ? (@ starts with {_string(value, pointer)}))"
        if key in ("$and", "$or", "$not"):
            return self.logical(key, value, path, pointer, depth + 1)
        raise FilterInvalid(pointer, f"Unknown operator {key}; the operators are {', '.join(sorted(OPERATORS))}.")

    def logical(self, key: str, value: Any, path: str, pointer: str, depth: int, top: bool = False) -> str:
        self.depth_check(depth, pointer)

        def sub(condition: dict, at: str) -> str:
            return self.top(condition, at, depth) if top else self.field(path, condition, at, depth)

        if key == "$not":
            if not isinstance(value, dict):
                raise FilterInvalid(pointer, "$not takes a condition (an object).")
            return _not(sub(value, pointer))
        if not isinstance(value, list) or not value:
            raise FilterInvalid(pointer, f"{key} takes a non-empty list of conditions.")
        if len(value) > FILTER_MAX_LIST:
            raise FilterInvalid(pointer, f"{key} takes at most {FILTER_MAX_LIST} conditions.")
        parts = []
        for index, condition in enumerate(value):
            at = f"{pointer}/{index}"
            if not isinstance(condition, dict):
                raise FilterInvalid(at, f"{key} takes a list of conditions (objects).")
            parts.append(sub(condition, at))
        return "(" + (" && " if key == "$and" else " || ").join(parts) + ")"
