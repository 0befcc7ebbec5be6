"""The OpenAPI schema documents the idempotency contract, and schemathesis finds the live API true to it."""
import re
import subprocess

import pytest
import yaml
from django.test import Client
from django.urls import URLResolver, get_resolver

from tests.fuzzing import ENV, SEED
from tests.processes import BIN, ROOT, free_port, gunicorn

pytestmark = pytest.mark.django_db(transaction=True)


def _schema():
    response = Client().get("/api/schema/")
    assert response.status_code == 200
    return yaml.safe_load(response.content)


def _routes(patterns, prefix=""):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern.callback


def _routed_writes() -> set[tuple[str, str]]:
    """(path as OpenAPI writes it, method) of every POST and PATCH the resolver routes to an API view."""
    writes = set()
    for route, callback in _routes(get_resolver().url_patterns):
        view = getattr(callback, "cls", None)  # a DRF view
        if view is None or not route.startswith("api/"):
            continue
        path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        writes |= {(path, method) for method in ("post", "patch") if hasattr(view, method)}
    return writes


def test_every_write_documents_the_idempotency_key_and_its_problems():
    schema = _schema()
    writes = [(path, method, op) for path, ops in schema["paths"].items() for method, op in ops.items()
              if method in ("post", "patch")]
    # every write the URL resolver routes to a view is in the schema, and nothing else
    assert {(path, method) for path, method, _ in writes} == _routed_writes()
    for path, method, op in writes:
        (header,) = [p for p in op["parameters"] if p["in"] == "header" and p["name"] == "Idempotency-Key"]
        assert header["required"] is True
        assert "24 hours" in header["description"] and "Idempotent-Replay" in header["description"]
        for status in ("400", "401", "409", "413", "415", "429"):
            assert "application/problem+json" in op["responses"][status]["content"], (path, method, status)
    documented = " ".join(op["responses"][s]["description"] for _, _, op in writes for s in op["responses"]
                          if s[0] == "4")
    for code in ("validation_error", "idempotency_key_missing", "idempotency_key_invalid",
                 "idempotency_key_reused", "idempotency_key_in_progress", "not_authenticated", "not_found",
                 "payload_too_large", "unsupported_media_type", "throttled"):
        assert code in documented, code
    reads = [op for ops in schema["paths"].values() for method, op in ops.items() if method == "get"]
    assert all("throttled" in op["responses"]["429"]["description"] for op in reads if "401" in op["responses"])
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_docs_page_is_served_without_a_cdn():
    page = Client().get("/api/docs/")
    assert page.status_code == 200
    assert b"swagger-ui" in page.content and b"cdn.jsdelivr" not in page.content


@pytest.mark.slow
def test_schemathesis_finds_no_5xx_and_no_response_outside_the_schema(api, tmp_path):
    # some data for the read and retry operations to find
    assert api.post("endpoints", {"url": "https://hooks.example.com/"}).status_code == 201
    api.post("events", {"type": "invoice.paid", "data": {"n": 1}})
    server = gunicorn(free_port(), workers=2, threads=4)
    try:
        result = subprocess.run(
            [str(BIN / "st"), "run", f"{server.url}/api/schema/", "--url", server.url,
             "-H", f"Authorization: Bearer {api.token}",
             "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                         "response_schema_conformance",
             # One worker: schemathesis's threads hit CPython 3.11.7's "AST constructor recursion depth
             # mismatch" (hypothesis parses lambdas' source with `ast` from both at once). Without the
             # long-poll reads (`…/messages?wait=` holds a request up to 30 s, past the request timeout);
             # their parameters' refusals are tests/test_polling.py's.
             "--exclude-path-regex", "/messages$",
             "--max-examples", "25", "--seed", str(SEED), "--workers", "1", "--request-timeout", "20",
             "--phases", "examples,coverage,fuzzing", "--no-color", "--generation-database", "none",
             "--report", "junit", "--report-dir", str(tmp_path)],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        server.stop()
    assert result.returncode == 0, (f"replay with {ENV}={SEED}\n" + result.stdout[-6000:] + result.stderr[-2000:]
                                    + server.output()[-3000:])
    generated = re.search(r"(\d+) generated", result.stdout)
    assert generated and int(generated.group(1)) >= 300, result.stdout[-3000:]
