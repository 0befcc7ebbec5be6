"""A local OTLP/HTTP trace receiver for tests: what a collector (Jaeger, Tempo, the OpenTelemetry Collector)
would get, decoded with opentelemetry-proto (ExportTraceServiceRequest), never by hand."""
import gzip
import threading
import time
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from testkit.local_server import LocalServer, QuietHandler

KINDS = {ProtoSpan.SPAN_KIND_INTERNAL: "INTERNAL", ProtoSpan.SPAN_KIND_SERVER: "SERVER",
         ProtoSpan.SPAN_KIND_CLIENT: "CLIENT", ProtoSpan.SPAN_KIND_PRODUCER: "PRODUCER",
         ProtoSpan.SPAN_KIND_CONSUMER: "CONSUMER", ProtoSpan.SPAN_KIND_UNSPECIFIED: "UNSPECIFIED"}


def _value(value: AnyValue):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class Span:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    links: list[tuple[str, str, dict]] = field(default_factory=list)  # (trace id, span id, attributes)

    def as_dict(self) -> dict:
        return {**self.__dict__, "links": [list(link) for link in self.links]}


class OtlpReceiver:
    """Accepts POST /v1/traces (protobuf, optionally gzip) and keeps every span it decodes."""

    def __init__(self):
        self.spans: list[Span] = []
        self.requests = 0
        self._changed = threading.Condition()
        receiver = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._take(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self._server = LocalServer(Handler)
        self.url = f"http://127.0.0.1:{self._server.port}"

    def _take(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(Span(
                        service=resource.get("service.name", ""), name=span.name, kind=KINDS[span.kind],
                        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(), start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        status_code=span.status.code, status_message=span.status.message,
                        links=[(link.trace_id.hex(), link.span_id.hex(),
                                {a.key: _value(a.value) for a in link.attributes}) for link in span.links]))
        with self._changed:
            self.requests += 1
            self.spans.extend(spans)
            self._changed.notify_all()

    def wait_for(self, predicate, timeout: float = 30.0) -> list[Span]:
        """Block until predicate(all spans so far) is true; the spans. Fails the test after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self.spans):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    names = sorted({(s.service, s.name) for s in self.spans})
                    raise AssertionError(f"spans never matched; {len(self.spans)} received: {names}")
                self._changed.wait(min(remaining, 0.5))
            return list(self.spans)

    def close(self) -> None:
        self._server.close()
