"""Requests that carry a NUL character in their path or query string are refused before any view runs.

PostgreSQL's text cannot hold U+0000, so an id or a filter with one made every lookup fail with a database
error, a 500 (an id in an API or portal URL, a portal or admin filter). No resource has such a name: the path
is 404, the query 400, as problem+json like every other refusal (SPEC §5). Bodies are checked where they are
parsed (intake/body.py; DRF's and Django's form fields refuse NUL themselves).
"""
from django.http import HttpRequest, HttpResponse

from intake.problems import problem_response


def refuse_nul_characters(get_response):
    def middleware(request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path:
            return problem_response(status_code=404, code="not_found", detail="No such path (it holds a NUL).")
        query = request.META.get("QUERY_STRING", "")
        if "%00" in query or "\x00" in query:
            return problem_response(status_code=400, code="validation_error",
                                    detail="The query string holds a NUL character (%00).")
        return get_response(request)

    return middleware
