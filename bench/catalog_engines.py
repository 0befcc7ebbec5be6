"""`python -m bench.catalog_engines`: one validation of the catalog bench's schema and data (bench/__main__.py
CATALOG_SCHEMA) with jsonschema on Python's `re` (before RE2), jsonschema on RE2 (Herald's,
webhooks/linear_regex.py) and jsonschema-rs on Rust's linear `regex`; and the `^(a+)+$` attack on the
two linear ones. In this process, best of 5 rounds of 5,000; no server. docs/api.md quotes it."""
import os
import re
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("SECRET_KEY", "bench-catalog-engines-only")
os.environ.setdefault("DEBUG", "true")


def per_call_us(fn, n: int = 5000) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - started) / n * 1e6)
    return round(best, 2)


def main() -> None:
    import django

    django.setup()
    import jsonschema_rs
    from jsonschema import Draft202012Validator

    from bench.__main__ import Bench
    from webhooks import event_schemas, linear_regex

    schema, data = Bench.CATALOG_SCHEMA, {"invoice": "in_1", "amount": 1200}
    with_re = Draft202012Validator(schema)
    with_re2 = event_schemas.schema_check(schema)
    rust = jsonschema_rs.Draft202012Validator(schema, pattern_options=jsonschema_rs.RegexOptions())
    print("one validation of the bench's data:")
    print(f"  jsonschema + re  (before) {per_call_us(lambda: event_schemas.instance_errors(with_re, data, pointer='/data'))} us")
    print(f"  jsonschema + RE2 (Herald) {per_call_us(lambda: event_schemas.instance_errors(with_re2, data, pointer='/data'))} us")
    print(f"  jsonschema-rs + regex     {per_call_us(lambda: [e.message for e in rust.iter_errors(data)])} us")
    print("one search of '^in_[A-Za-z0-9]+$' in 'in_1':")
    print(f"  re  {per_call_us(lambda: re.search('^in_[A-Za-z0-9]+$', 'in_1'), 50000)} us")
    print(f"  RE2 {per_call_us(lambda: linear_regex.search('^in_[A-Za-z0-9]+$', 'in_1'), 50000)} us")
    attack, text = {"type": "string", "pattern": "^(a+)+$"}, "a" * 40 + "!"
    validator = event_schemas.schema_check(attack)
    started = time.perf_counter()
    event_schemas.instance_errors(validator, text, pointer="/data")
    print(f"the attack (40 a's and '!'): RE2 {(time.perf_counter() - started) * 1e3:.3f} ms", end="; ")
    rust = jsonschema_rs.Draft202012Validator(attack, pattern_options=jsonschema_rs.RegexOptions())
    started = time.perf_counter()
    list(rust.iter_errors(text))
    print(f"jsonschema-rs {(time.perf_counter() - started) * 1e3:.3f} ms; Python's re: not run (hours)")


if __name__ == "__main__":
    main()
