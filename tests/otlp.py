"""An OTLP/HTTP receiver for tests: a real HTTP server on 127.0.0.1 decoding the protobuf requests."""

from __future__ import annotations

import gzip
import http.server
import threading

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest


class OtlpReceiver:
    """Collects every OTLP/HTTP request POSTed to /v1/metrics and /v1/logs, decoded from protobuf."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.log_requests: list[ExportLogsServiceRequest] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                protobuf = self.headers["Content-Type"] == "application/x-protobuf"
                if self.path == "/v1/metrics" and protobuf:
                    receiver.requests.append(ExportMetricsServiceRequest.FromString(body))
                    self.send_response(200)
                elif self.path == "/v1/logs" and protobuf:
                    receiver.log_requests.append(ExportLogsServiceRequest.FromString(body))
                    self.send_response(200)
                else:
                    self.send_response(404)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def last_metric(self, name: str):
        """The metric ``name`` (name, unit, description, data) in the last request that carried it."""
        for request in reversed(self.requests):
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        if metric.name == name:
                            return metric
        raise AssertionError(f"{name} was never exported")

    def last_points(self, name: str) -> list:
        """The data points of ``name`` in the last request that carried it."""
        metric = self.last_metric(name)
        return list(getattr(metric, metric.WhichOneof("data")).data_points)

    def metric_names(self) -> set[str]:
        """Every metric name of the last request."""
        return {
            metric.name
            for resource_metrics in self.requests[-1].resource_metrics
            for scope_metrics in resource_metrics.scope_metrics
            for metric in scope_metrics.metrics
        }

    def log_records(self) -> list:
        return [
            record
            for request in self.log_requests
            for resource_logs in request.resource_logs
            for scope_logs in resource_logs.scope_logs
            for record in scope_logs.log_records
        ]


def attributes(key_values) -> dict:
    out = {}
    for kv in key_values:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out
