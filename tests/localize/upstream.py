"""A Prometheus HTTP API that answers badly on purpose, in front of a real Prometheus (or a fixed answer).

Each analyzer run begins with the same query (every rank's position, ``trainhealth_comm_started_seq``, judged for
hangs); that request takes the next answer of :attr:`Upstream.script`, and the rest of the run's requests get the
same kind. ``good`` forwards
the request to the real Prometheus unchanged; every other kind is one way an upstream answers badly.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: every bad answer the handler can give, one analyzer run each (connection refused is the server stopped)
BAD_ANSWERS = (
    "garbage",
    "empty_body",
    "truncated",
    "deep_nesting",
    "json_array",
    "wrong_shape",
    "status_error",
    "http_404",
    "http_503",
    "hangup",
    "timeout",
    "trickle",
    "empty_result",
    "nan_values",
    "inf_values",
    "huge_values",
)
#: how long the ``timeout`` and ``trickle`` answers keep the client waiting
STALL_S = 3.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:  # a client that gave up: expected here
        pass


class Upstream:
    """The scripted server. ``good`` gives the good answer to a path and query string: (status, body)."""

    def __init__(self, good: Callable[[str], tuple[int, bytes]]) -> None:
        self.good = good
        self.script: deque[str] = deque()
        self.hold = "good"  # what runs get once the script is done
        self.current = "good"
        self.served: list[tuple[float, str]] = []  # (time, kind) of each run's first query
        self.port = 0
        self._lock = threading.Lock()
        self._server: _Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (on the same port as before, after :meth:`stop`)."""
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                upstream._answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = _Server(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        """Stop listening: connections are refused until :meth:`start`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _kind(self, request: BaseHTTPRequestHandler) -> str:
        url = urllib.parse.urlsplit(request.path)
        query = urllib.parse.parse_qs(url.query).get("query", [""])[0]
        with self._lock:
            if url.path == "/api/v1/query" and query.startswith("trainhealth_comm_started_seq"):  # a run begins
                self.current = self.script.popleft() if self.script else self.hold
                self.served.append((time.time(), self.current))
            return self.current

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        kind = self._kind(request)
        if kind == "hangup":  # close without a word
            return
        if kind == "timeout":
            time.sleep(STALL_S)
            return
        if kind == "trickle":  # headers at once, then a byte now and then: never the whole answer in time
            request.send_response(200)
            request.send_header("Content-Type", "application/json")
            request.send_header("Content-Length", "100000")
            request.end_headers()
            deadline = time.monotonic() + STALL_S
            while time.monotonic() < deadline:
                request.wfile.write(b" ")
                request.wfile.flush()
                time.sleep(0.05)
            return
        status, body = self._body(kind, request.path)
        if kind == "truncated":  # a connection torn half-way: Content-Length promises more than comes
            request.send_response(status)
            request.send_header("Content-Type", "application/json")
            request.send_header("Content-Length", str(len(body)))
            request.end_headers()
            request.wfile.write(body[: len(body) // 2])
            request.close_connection = True
            return
        request.send_response(status)
        request.send_header("Content-Type", "application/json" if body[:1] in (b"{", b"[") else "text/html")
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    def _body(self, kind: str, path: str) -> tuple[int, bytes]:
        if kind in ("good", "truncated"):
            return self.good(path)
        if kind in ("nan_values", "inf_values", "huge_values"):
            status, body = self.good(path)
            value = {"nan_values": "NaN", "inf_values": "+Inf", "huge_values": "1e308"}[kind]
            return status, _with_values(body, value)
        fixed = {
            "garbage": (200, bytes(range(256)) * 4),
            "empty_body": (200, b""),
            "deep_nesting": (200, b"[" * 200_000 + b"]" * 200_000),
            "json_array": (200, b"[1, 2, 3]"),
            "wrong_shape": (
                200,
                json.dumps({"status": "success", "data": {"resultType": "matrix", "result": {"oops": 1}}}).encode(),
            ),
            "status_error": (
                200,
                json.dumps(
                    {
                        "status": "error",
                        "errorType": "execution",
                        "error": "query timed out in expression evaluation\n(5s)",
                    }
                ).encode(),
            ),
            "http_404": (404, b"<html><body>404 page not found</body></html>"),
            "http_503": (503, b"upstream connect error or disconnect/reset before headers"),
            "empty_result": (
                200,
                json.dumps(
                    {
                        "status": "success",
                        "data": {
                            "resultType": "vector" if path.startswith("/api/v1/query?") else "matrix",
                            "result": [],
                        },
                    }
                ).encode(),
            ),
        }
        return fixed[kind]


def _with_values(body: bytes, value: str) -> bytes:
    """The same answer with every sample's value replaced."""
    answer = json.loads(body)
    for series in answer["data"]["result"]:
        if "values" in series:
            series["values"] = [[t, value] for t, _ in series["values"]]
        else:
            series["value"] = [series["value"][0], value]
    return json.dumps(answer).encode()


def forward_to(prometheus_url: str) -> Callable[[str], tuple[int, bytes]]:
    """Good answers: the request as the real Prometheus at ``prometheus_url`` answers it."""

    def good(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(prometheus_url + path, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    return good
