"""JSON Schema's regular expressions on RE2, a linear-time engine (SPEC §12).

jsonschema matches `pattern`, `patternProperties` (and, through them, `additionalProperties` and
`unevaluatedProperties`) with Python's `re`, which backtracks: `"^(a+)+$"` against 40 `a`s and a `!`
takes longer than the age of the universe, holding the GIL, so the whole gunicorn worker stops. RE2
(google-re2) matches in time linear in the text, whatever the pattern; it refuses what it cannot do so
(backreferences, lookaround), and such a pattern is refused when the catalog entry is written.

`KEYWORDS` are jsonschema's own keyword functions, the same code, with `re` in their globals replaced by
this module's `search` (these four functions and the two helpers they call are the only places jsonschema
matches a pattern against data; one helper is rewritten here, see `_find_additional_properties`). Rebinding their globals rather than copying them keeps jsonschema's
messages, paths and semantics exactly; only Herald's validator class uses them, so nothing else in the
process changes. `FORMAT_CHECKER` is draft 2020-12's with `regex` checked by RE2: it is what checks each
`pattern` of a schema against the meta-schema (`"format": "regex"`) when the schema is written.
"""
from __future__ import annotations

import functools
import types

import re2
from jsonschema import Draft202012Validator, FormatChecker, _keywords, _utils

# A pattern longer than this is refused when written (with the schema's size bound, it keeps a check's
# cost small: RE2's time is linear in the text times the pattern's size).
MAX_PATTERN_CHARS = 1000
# RE2's own default budget for one pattern (its program and its DFA's cache, which grows only as the
# pattern is used). Smaller budgets make RE2 leave its DFA for its NFA sooner, which is still linear but
# far slower: `.{500}x` over 256 KiB took 3.6 s with 1 MiB, 20 ms with 8 MiB (measured here).
MAX_PATTERN_MEMORY = 8 << 20
# Linear time is text x program size: a large program over a large text is still slow (`.{1000}x` over
# 256 KiB of non-ASCII text: 17 s, with RE2's DFA out of memory). A pattern whose program (forward or
# reverse) is larger is refused when written; at this bound the slowest search measured over a 256 KiB
# string took 40 ms (`[\s\S]{370}!`), with the GIL released meanwhile. `^.{1,280}$` is 2,521; `^\p{L}+$`
# 1,199; a UUID's pattern 70. Use maxLength for lengths, not `.{1,5000}`.
MAX_PROGRAM_SIZE = 3000
MAX_COMPILED = 500   # compiled patterns held per process

error = re2.error


class PatternRefused(ValueError):
    """RE2 cannot match this pattern in linear time (or it is not a regular expression at all)."""


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = MAX_PATTERN_MEMORY
    options.log_errors = False   # a refused pattern is an answer, not a line on stderr
    return options


_OPTIONS = _options()


@functools.lru_cache(maxsize=MAX_COMPILED)
def compiled(pattern: str):
    """The RE2 program of `pattern`; PatternRefused when RE2 will not take it."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternRefused(f"A pattern may have at most {MAX_PATTERN_CHARS} characters.")
    try:
        program = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        raise PatternRefused(f"{pattern[:100]!r} is refused by RE2, the linear-time engine patterns are matched "
                             f"with (it has no backreferences or lookaround): {reason}") from None
    except ValueError as exc:   # a lone surrogate (JSON's "\ud800"), which has no UTF-8 for RE2
        raise PatternRefused(f"{pattern[:100]!r} cannot be a pattern: {exc}") from None
    size = max(program.programsize, program.reverseprogramsize)
    if size > MAX_PROGRAM_SIZE:
        raise PatternRefused(f"{pattern[:100]!r} compiles to {size} RE2 instructions; at most {MAX_PROGRAM_SIZE} "
                             "are allowed (bound lengths with minLength/maxLength rather than a repetition).")
    return program


_UNANCHORED = re2._Anchor.UNANCHORED
_NO_MATCH = -1


def search(pattern: str, string: str) -> bool:
    """Whether `pattern` matches somewhere in `string` (`re.search`'s truth, which is all jsonschema asks of
    it), on RE2. RE2's own program is asked directly: google-re2's `search` also maps every match offset
    back from UTF-8 to characters for a match object nobody reads, which made one search 2.8 µs against
    `re`'s 0.3; this is 0.45 (measured here, bench.catalog_engines)."""
    program = compiled(pattern)
    try:
        text = string.encode("utf-8")
    except UnicodeEncodeError:   # a lone surrogate in the text (the API refuses them; the admin's forms may not)
        text = string.encode("utf-8", "surrogatepass")
    return program._regexp.Match(_UNANCHORED, text, 0, len(text))[0][0] != _NO_MATCH


class _RE2Module:
    """Stands in for the `re` module in the rebound functions, which call nothing of it but `search`."""

    search = staticmethod(search)


def _rebound(function, **names):
    """`function` with the same code, and `re` (and `names`) in its globals replaced."""
    scope = dict(function.__globals__, re=_RE2Module, **names)
    copy = types.FunctionType(function.__code__, scope, function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    scope.update({function.__name__: copy})   # a recursive function calls its copy
    return copy




def _find_additional_properties(instance, schema):
    """jsonschema's `find_additional_properties`, matching each pattern on its own rather than all of them
    joined into one (whose program could be over MAX_PROGRAM_SIZE when each one is not)."""
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    for property in instance:
        if property not in properties and not any(search(pattern, property) for pattern in patterns):
            yield property


_find_evaluated_property_keys_by_schema = _rebound(_utils.find_evaluated_property_keys_by_schema)

KEYWORDS = {
    "pattern": _rebound(_keywords.pattern),
    "patternProperties": _rebound(_keywords.patternProperties),
    "additionalProperties": _rebound(_keywords.additionalProperties,
                                     find_additional_properties=_find_additional_properties),
    "unevaluatedProperties": _rebound(_keywords.unevaluatedProperties,
                                      find_evaluated_property_keys_by_schema=_find_evaluated_property_keys_by_schema),
}


def _is_regex(instance) -> bool:
    if not isinstance(instance, str):
        return True
    compiled(instance)
    return True


FORMAT_CHECKER = FormatChecker(formats=())
FORMAT_CHECKER.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
FORMAT_CHECKER.checkers["regex"] = (_is_regex, (PatternRefused,))
