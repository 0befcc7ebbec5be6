"""Middleware: one request id per API call, in the logs, in `X-Request-Id`, and on the events it made."""
from webhooks.logcontext import new_request_id, request_id


class RequestIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        value = new_request_id(request.META.get("HTTP_X_REQUEST_ID"))
        token = request_id.set(value)
        try:
            response = self.get_response(request)
        finally:
            request_id.reset(token)
        response["X-Request-Id"] = value
        return response
