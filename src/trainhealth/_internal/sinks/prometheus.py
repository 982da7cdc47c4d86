"""The Prometheus sink: a collector over a :class:`~trainhealth._internal.store.MetricStore`
and an HTTP(S) server for it with optional mTLS and basic auth.

The server is a :class:`~trainhealth._internal.sinks.serving.BoundedHTTPServer`: a fixed number
of threads whatever the clients do, and deadlines that drop slow or stalled ones.

The collector reads a snapshot at scrape time and builds metric families from
it; nothing is registered per sample, and a failure in one family is counted in
``trainhealth_exporter_errors_total{source="prometheus"}`` without failing the
scrape.

>>> from prometheus_client import CollectorRegistry, generate_latest
>>> from trainhealth._internal import catalog
>>> from trainhealth._internal.identity import Identity
>>> from trainhealth._internal.store import MetricStore
>>> store = MetricStore()
>>> store.set(catalog.TRAIN_LOSS, 1.75)
>>> registry = CollectorRegistry()
>>> registry.register(StoreCollector(store, Identity("demo", "node-a", 0, 0, 1)))
>>> print(generate_latest(registry).decode().splitlines()[-1])
trainhealth_train_loss{host="node-a",job="demo",rank="0"} 1.75
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from trainhealth._internal._gil import yield_gil
from trainhealth._internal.catalog import MetricKind
from trainhealth._internal.identity import Identity
from trainhealth._internal.sinks.serving import BoundedHTTPServer, ServingLimits
from trainhealth._internal.store import Family, HistogramValue, MetricStore

__all__ = ["BasicAuth", "MetricsServer", "StoreCollector", "TLSError", "TLSFiles"]

log = logging.getLogger(__name__)

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class StoreCollector(Collector):
    """Exports every series of a store, with the identity labels prepended.

    ``identity`` may be a callable that returns the identity at scrape time, or ``None`` while its job label
    waits for torch.distributed (:class:`~trainhealth._internal.identity.RunIdentity`): nothing is exported
    until then, so no series ever carries a provisional job label.
    """

    def __init__(self, store: MetricStore, identity: Identity | Callable[[], Identity | None]) -> None:
        self._store = store
        self._identity = identity

    def collect(self) -> Iterator[Metric]:
        try:
            identity = self._identity() if callable(self._identity) else self._identity
            if identity is None:
                return
            families = self._store.snapshot()
        except Exception as exc:
            self._store.record_error("prometheus", exc)
            return
        identity_labels = identity.labels
        for family in families:
            try:
                metric = _to_metric(family, [identity_labels[name] for name in family.spec.identity])
            except Exception as exc:
                self._store.record_error("prometheus", exc)
                continue
            yield metric
            yield_gil()  # a render is ~1 ms of Python: in pieces, so the training thread never waits for all of it


def _to_metric(family: Family, identity_values: list[str]) -> Metric:
    spec = family.spec
    labels = list(spec.all_labels)
    if spec.kind is MetricKind.INFO:
        base = spec.prometheus_name.removesuffix("_info")
        info = InfoMetricFamily(base, spec.help, labels=list(labels[: len(identity_values)]))
        for values, _ in family.samples:
            info.add_metric(identity_values, dict(zip(spec.labels, values)))
        return info
    suffix = spec.unit.prometheus_suffix
    unit = suffix if suffix and spec.prometheus_name.removesuffix("_total").endswith("_" + suffix) else ""
    metric: Metric
    if spec.kind is MetricKind.GAUGE:
        metric = GaugeMetricFamily(spec.prometheus_name, spec.help, labels=labels, unit=unit)
    elif spec.kind is MetricKind.COUNTER:
        metric = CounterMetricFamily(spec.prometheus_name, spec.help, labels=labels, unit=unit)
    else:
        metric = HistogramMetricFamily(spec.prometheus_name, spec.help, labels=labels, unit=unit)
    for values, value in family.samples:
        label_values = identity_values + list(values)
        if isinstance(value, HistogramValue):
            bounds = [floatToGoString(b) for b in spec.buckets] + ["+Inf"]
            # a histogram's samples are HistogramValues, a gauge's or a counter's are floats
            cast(HistogramMetricFamily, metric).add_metric(
                label_values, list(zip(bounds, value.cumulative())), value.sum
            )
        else:
            cast("GaugeMetricFamily | CounterMetricFamily", metric).add_metric(label_values, value)
    return metric


class TLSError(ValueError):
    """A TLS file cannot be used; ``field`` is the :class:`TLSFiles` field at fault (``certfile``, ...)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class TLSFiles:
    """Server certificate and key; with ``client_cafile``, clients must present a certificate it signed.

    >>> TLSFiles("/no/cert.pem", "/no/key.pem").context()
    Traceback (most recent call last):
    ...
    trainhealth._internal.sinks.prometheus.TLSError: certfile: cannot read /no/cert.pem: No such file or directory
    """

    certfile: str
    keyfile: str
    client_cafile: str | None = None

    def context(self) -> ssl.SSLContext:
        """The server's TLS context; :class:`TLSError` names the file that cannot be used and why."""
        for field in ("certfile", "keyfile", "client_cafile"):
            path = getattr(self, field)
            if path is None:
                continue
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise TLSError(field, f"cannot read {path}: {exc.strerror or exc}") from None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:  # the certificates alone first, so a bad key is told apart from a bad certificate
            ssl.create_default_context().load_verify_locations(cafile=self.certfile)
        except ssl.SSLError as exc:
            raise TLSError(
                "certfile", f"{self.certfile} holds no usable PEM certificate ({exc.reason or exc})"
            ) from None
        try:
            context.load_cert_chain(self.certfile, self.keyfile, password=_no_password)
        except (ssl.SSLError, TLSError) as exc:
            reason = exc.problem if isinstance(exc, TLSError) else exc.reason or str(exc)
            raise TLSError(
                "keyfile", f"{self.keyfile} is not a usable private key for {self.certfile} ({reason})"
            ) from None
        if self.client_cafile:
            try:
                context.load_verify_locations(cafile=self.client_cafile)
            except ssl.SSLError as exc:
                raise TLSError(
                    "client_cafile", f"{self.client_cafile} holds no usable PEM CA certificate ({exc.reason or exc})"
                ) from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def _no_password() -> str:
    # without a callback OpenSSL would prompt on the terminal, and a training process would hang there
    raise TLSError("keyfile", "the key is encrypted; trainhealth needs an unencrypted key")


@dataclass(frozen=True)
class BasicAuth:
    username: str
    password: str

    def __repr__(self) -> str:
        return f"BasicAuth(username={self.username!r}, password=<hidden>)"

    def accepts(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        username, _, password = decoded.partition(":")
        # evaluate both comparisons: no early exit that would time which part was wrong
        user_ok = hmac.compare_digest(username.encode(), self.username.encode())
        password_ok = hmac.compare_digest(password.encode(), self.password.encode())
        return user_ok and password_ok


def _require_basic_auth(app: WSGIApp, auth: BasicAuth) -> WSGIApp:
    def authenticated(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if auth.accepts(environ.get("HTTP_AUTHORIZATION", "")):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [
                ("WWW-Authenticate", 'Basic realm="trainhealth", charset="UTF-8"'),
                ("Content-Type", "text/plain; charset=utf-8"),
            ],
        )
        return [b"authentication required\n"]

    return authenticated


def _cache_by_version(app: WSGIApp, version: Callable[[], int]) -> WSGIApp:
    """Serve the last response again while ``version()`` is unchanged (per negotiated format).

    A node exporter's store changes once per sampling pass while Prometheus
    servers (often several, for HA) scrape it many times in between.
    """
    cache: dict[tuple[str, ...], tuple[int, str, list[tuple[str, str]], bytes]] = {}
    lock = threading.Lock()

    def cached(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        key = tuple(environ.get(name, "") for name in ("HTTP_ACCEPT", "HTTP_ACCEPT_ENCODING", "QUERY_STRING"))
        current = version()
        with lock:
            hit = cache.get(key)
        if hit is None or hit[0] != current:
            captured: dict[str, Any] = {}

            def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
                captured["status"], captured["headers"] = status, headers
                return lambda data: None

            body = b"".join(app(environ, capture))
            hit = (current, captured["status"], captured["headers"], body)
            if captured["status"].startswith("200"):
                with lock:
                    if len(cache) > 16:  # bounded: clients vary their headers
                        cache.clear()
                    cache[key] = hit
        start_response(hit[1], hit[2])
        return [hit[3]]

    return cached


def _route(metrics_app: WSGIApp) -> WSGIApp:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path in ("/", "/healthz"):
            body = b"ok\n" if path == "/healthz" else b"trainhealth exporter: metrics at /metrics\n"
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [body]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found; metrics are at /metrics\n"]

    return app


def _listen(addr: str, port: int) -> socket.socket:
    """A socket bound to ``addr:port`` (IPv6 when ``addr`` has a colon), address reuse on."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((addr, port))
    except BaseException:
        listener.close()
        raise
    return listener


class MetricsServer:
    """Serves ``registry`` at /metrics on a daemon thread; HTTPS and basic auth when configured.

    With ``version`` (a function whose value changes whenever the data does), an
    unchanged registry is answered from the previous rendering. ``limits`` bounds the
    threads, connections and per-connection time (:class:`~trainhealth._internal.sinks.serving.ServingLimits`).
    A TLS file that cannot be used raises :class:`TLSError`, an address or port that cannot
    be bound :class:`OSError`.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        addr: str = "0.0.0.0",
        port: int = 0,
        tls: TLSFiles | None = None,
        basic_auth: BasicAuth | None = None,
        version: Callable[[], int] | None = None,
        limits: ServingLimits | None = None,
    ) -> None:
        context = tls.context() if tls is not None else None  # before binding: a bad file names itself
        metrics_app = make_wsgi_app(registry)
        if version is not None:
            metrics_app = _cache_by_version(metrics_app, version)
        app = _route(metrics_app)
        if basic_auth is not None:
            app = _require_basic_auth(app, basic_auth)
            if tls is None:
                log.warning("trainhealth: basic auth without TLS sends the password in clear text")
        self._server = BoundedHTTPServer(
            app, _listen(addr, port), tls=context, limits=limits, name="trainhealth-metrics"
        )

    @property
    def port(self) -> int:
        return int(self._server.address[1])

    @property
    def host(self) -> str:
        """The address the server is bound to: ``0.0.0.0`` (or ``::``) when it listens on every interface."""
        return str(self._server.address[0])

    @property
    def url(self) -> str:
        """The /metrics URL at the bound address (``http://0.0.0.0:9450/metrics`` on every interface)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self._server.scheme}://{host}:{self.port}/metrics"

    @property
    def open_connections(self) -> int:
        return self._server.open_connections

    def close(self) -> None:
        self._server.close()
