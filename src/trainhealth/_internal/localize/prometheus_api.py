"""A minimal client of Prometheus's HTTP API, and the parsing of its answers into :class:`Series`.

:class:`SourceError` lives here, below :mod:`trainhealth._internal.localize.sources` (which re-exports it): the
one error the client and every source raise for input they cannot use.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PrometheusClient", "Series", "SourceError", "one_line"]


class SourceError(Exception):
    """The input could not be read this time (one line; the analyzer retries on its next run)."""


@dataclass(frozen=True)
class Series:
    """One series of a Prometheus answer: its labels and its (unix time, value) samples, values as parsed
    (``NaN`` and infinities kept: a rate over an interval without events is ``NaN``)."""

    labels: dict[str, str]
    samples: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class PrometheusClient:
    """A minimal client of Prometheus's HTTP API (``/api/v1/query`` and ``/api/v1/query_range``).

    Every way an answer can be bad — no connection, no answer within ``timeout`` seconds (the whole answer,
    not each read), an HTTP error, more than ``max_bytes``, bytes that are not JSON, JSON that is not an
    answer of the kind asked for, ``"status": "error"`` — raises :class:`SourceError` with one line that
    says which; nothing else escapes.
    """

    url: str
    timeout: float = 10.0
    ca_file: str | None = None
    bearer_token_file: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = field(default=None, repr=False)
    max_bytes: int = 256 * 2**20

    def query(self, promql: str) -> list[Series]:
        """An instant query whose answer is a vector (one sample per series)."""
        return _series(self._get("/api/v1/query", {"query": promql}), "vector", f"Prometheus at {self.url}")

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        """A range query (a matrix: the samples every ``step`` seconds from ``start`` to ``end``)."""
        body = self._get(
            "/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        )
        return _series(body, "matrix", f"Prometheus at {self.url}")

    def _get(self, path: str, params: dict[str, str]) -> object:
        where = f"Prometheus at {self.url}"
        try:
            request = urllib.request.Request(f"{self.url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}")
            for name, value in self._headers().items():
                request.add_header(name, value)
            context = ssl.create_default_context(cafile=self.ca_file) if self.url.startswith("https") else None
            deadline = time.monotonic() + self.timeout
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as response:
                raw = self._read(response, deadline)
        except urllib.error.HTTPError as exc:
            raise SourceError(f"{where} answered {exc.code}: {_error_detail(exc) or exc.reason}") from None
        except TimeoutError:
            raise SourceError(f"{where} did not answer within {self.timeout:g}s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise SourceError(f"{where} did not answer within {self.timeout:g}s") from None
            raise SourceError(f"cannot query {where}: {one_line(exc.reason)}") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:  # reset, torn or garbled HTTP, a bad URL
            raise SourceError(f"cannot query {where}: {type(exc).__name__}: {one_line(exc)}") from None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:  # garbage, truncated, not UTF-8, nested too deep
            raise SourceError(
                f"{where} answered something that is not JSON ({len(raw)} bytes: {one_line(exc)})"
            ) from None

    def _read(self, response: http.client.HTTPResponse, deadline: float) -> bytes:
        """The body, within the deadline (a server that trickles bytes times out too) and ``max_bytes``."""
        chunks: list[bytes] = []
        size = 0
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError
            chunk = response.read1(65536)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > self.max_bytes:
                raise SourceError(f"Prometheus at {self.url} answered more than {self.max_bytes} bytes")
            chunks.append(chunk)

    def _headers(self) -> dict[str, str]:
        if self.bearer_token_file:
            return {"Authorization": f"Bearer {_read_secret(self.bearer_token_file)}"}
        if self.basic_auth_username and self.basic_auth_password_file:
            pair = f"{self.basic_auth_username}:{_read_secret(self.basic_auth_password_file)}".encode()
            return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
        return {}


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """Prometheus's ``error`` text from an error answer, when the body is one (first 4 KiB)."""
    try:
        body = json.loads(exc.read(4096))
    except (ValueError, RecursionError, OSError, http.client.HTTPException):
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    return one_line(error) if isinstance(error, str) else ""


def _series(body: object, kind: str, where: str = "Prometheus") -> list[Series]:
    """The series of an answer of ``kind`` (``vector`` or ``matrix``) from ``where``; any other shape is a
    SourceError.

    >>> _series({"status": "success", "data": {"resultType": "vector", "result": [
    ...     {"metric": {"rank": "0"}, "value": [1700000000.5, "0.25"]}]}}, "vector")
    [Series(labels={'rank': '0'}, samples=((1700000000.5, 0.25),))]
    >>> _series({"status": "success", "data": {"result": {"rank": "0"}}}, "matrix")
    Traceback (most recent call last):
    trainhealth._internal.localize.prometheus_api.SourceError: Prometheus answered JSON of an unexpected shape: data.resultType is None, not 'matrix'
    """

    def _shape(problem: str) -> SourceError:
        return SourceError(f"{where} answered JSON of an unexpected shape: {problem}")

    def _sample(pair: object, at: str) -> tuple[float, float]:
        """``[unix time, "value"]`` as two floats; the value may be NaN or infinite ("NaN", "+Inf")."""
        if not isinstance(pair, list) or len(pair) != 2:
            raise _shape(f"{at} is not a [time, value] pair")
        t, value = pair
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise _shape(f"{at} has no finite time")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _shape(f"{at} has no value")
        try:
            return float(t), float(value)
        except (ValueError, OverflowError):
            raise _shape(f"{at} has a value that is not a number") from None

    if not isinstance(body, dict):
        raise _shape(f"the answer is a {type(body).__name__}, not an object")
    status = body.get("status")
    if status == "error":
        raise SourceError(
            f"{where} refused the query: {one_line(body.get('errorType', 'error'))}: {one_line(body.get('error', ''))}"
        )
    if status != "success":
        raise _shape(f"status is {one_line(status)}, not success")
    data = body.get("data")
    if not isinstance(data, dict):
        raise _shape("data is not an object")
    if data.get("resultType") != kind:
        raise _shape(f"data.resultType is {one_line(data.get('resultType'))}, not {kind!r}")
    result = data.get("result")
    if not isinstance(result, list):
        raise _shape("data.result is not a list")
    out = []
    for index, item in enumerate(result):
        at = f"data.result[{index}]"
        if not isinstance(item, dict):
            raise _shape(f"{at} is not an object")
        labels = item.get("metric")
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise _shape(f"{at}.metric is not an object of label names and values")
        samples: tuple[tuple[float, float], ...]
        if kind == "vector":
            samples = (_sample(item.get("value"), f"{at}.value"),)
        else:
            values = item.get("values")
            if not isinstance(values, list):
                raise _shape(f"{at}.values is not a list")
            samples = tuple(_sample(pair, f"{at}.values[{i}]") for i, pair in enumerate(values))
        out.append(Series(labels, samples))
    return out


def one_line(value: object, limit: int = 200) -> str:
    """``value`` as text on one line, at most ``limit`` characters (upstream text goes into one log line).

    >>> one_line("bad\\nquery " + "x" * 300)[:20], len(one_line("x" * 300))
    ('bad query xxxxxxxxxx', 200)
    """
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_secret(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from None
