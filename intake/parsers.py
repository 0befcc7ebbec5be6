"""JSON parser that reuses the body the intake checks already parsed, so JSON is parsed once."""
from rest_framework.parsers import JSONParser


class CheckedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {}).get("request")
        checked = getattr(getattr(request, "_request", None), "herald_body", None)
        if checked is not None and checked.is_json:
            return checked.value
        return super().parse(stream, media_type, parser_context)
