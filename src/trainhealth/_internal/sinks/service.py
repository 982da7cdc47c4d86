"""Start and stop both sinks — the /metrics endpoint and the OTLP push (metrics, and events
as log records) — over one store."""

from __future__ import annotations

import errno
import importlib.metadata
import logging
import os
import platform
import socket
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from trainhealth._internal import catalog
from trainhealth._internal.config import ConfigError, Settings
from trainhealth._internal.events import EventLog
from trainhealth._internal.identity import Identity
from trainhealth._internal.sinks.prometheus import BasicAuth, MetricsServer, StoreCollector, TLSError, TLSFiles
from trainhealth._internal.store import MetricStore
from trainhealth._version import __version__

if TYPE_CHECKING:  # imported where used: the OTel SDK is slow to import
    from trainhealth._internal.sinks.otel import OtelExporter

__all__ = ["Sinks", "publish_build_info"]

log = logging.getLogger(__name__)


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def publish_build_info(store: MetricStore) -> None:
    """Set ``trainhealth_build_info`` without importing torch."""
    store.set_info(catalog.BUILD_INFO, (__version__, platform.python_version(), _installed_version("torch")))


class Sinks:
    """The running sinks of one process. Build with :meth:`start`; stop with :meth:`close`."""

    def __init__(
        self,
        server: MetricsServer | None,
        otel: OtelExporter | None,
        deferred_otel: Callable[[Identity], OtelExporter] | None = None,
    ) -> None:
        self.server = server
        self.otel = otel
        self._deferred_otel = deferred_otel
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def start(
        cls,
        store: MetricStore,
        identity: Identity,
        settings: Settings,
        env: Mapping[str, str] | None = None,
        events: EventLog | None = None,
        current: Callable[[], Identity | None] | None = None,
    ) -> Sinks:
        """Start what ``settings`` enables.

        ``current`` gives the identity at export time where its job label may still be pending (the
        Monitor's :class:`~trainhealth._internal.identity.RunIdentity`): /metrics exports nothing until it is
        fixed, and the OTLP push, whose resource names the job, starts at :meth:`identity_fixed`.

        A TLS file that cannot be used, an address or a port that cannot be bound raise
        :class:`ConfigError` naming that setting (``tls_keyfile``, ``prometheus_addr``, ``prometheus_port``).
        """
        env = os.environ if env is None else env
        publish_build_info(store)
        server = None
        endpoint = settings.prometheus
        if endpoint.enabled:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(StoreCollector(store, current if current is not None else identity))
            tls = None
            if endpoint.tls_certfile and endpoint.tls_keyfile:
                tls = TLSFiles(endpoint.tls_certfile, endpoint.tls_keyfile, endpoint.tls_client_cafile)
            auth = None
            password = endpoint.read_basic_auth_password()
            if endpoint.basic_auth_username and password:
                auth = BasicAuth(endpoint.basic_auth_username, password)
            port = endpoint.metrics_port(identity.local_rank)

            def version() -> int:  # the scrape cache's key: fixing a pending job label changes it (RANK_INFO)
                if current is not None:
                    current()
                return store.version

            try:
                server = MetricsServer(
                    registry, addr=endpoint.addr, port=port, tls=tls, basic_auth=auth, version=version
                )
            except TLSError as exc:
                raise ConfigError(f"tls_{exc.field}", exc.problem) from None
            except OSError as exc:
                setting = "prometheus_addr" if _address_problem(exc) else "prometheus_port"
                raise ConfigError(setting, f"cannot serve on {endpoint.addr}:{port}: {exc.strerror or exc}") from None
            log.info("trainhealth: serving metrics at %s", server.url)
        otel, deferred = None, None
        if settings.otel.active(env):  # the OpenTelemetry SDK loads only when OTLP is on
            from trainhealth._internal.sinks.otel import OtelExporter

            def start_otel(fixed: Identity) -> OtelExporter:
                return OtelExporter(store, fixed, events=events, close_timeout_s=settings.otel.close_timeout)

            if identity.pending:
                deferred = start_otel
            else:
                otel = start_otel(identity)
        return cls(server, otel, deferred)

    def identity_fixed(self, identity: Identity) -> None:
        """Start the OTLP push deferred until the job label was fixed; never raises (logged and dropped)."""
        with self._lock:
            start, self._deferred_otel = self._deferred_otel, None
            if start is None or self._closed:
                return
            try:
                self.otel = start(identity)
            except Exception:
                log.warning("trainhealth: the OTLP push could not start", exc_info=True)

    @property
    def metrics_url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def close(self) -> None:
        """Push the last OTLP export (waiting at most ``otel_close_timeout``) and stop serving; never raises."""
        with self._lock:
            self._closed = True
        if self.otel is not None:
            self.otel.shutdown()
            self.otel = None
        if self.server is not None:
            try:
                self.server.close()
            except Exception:
                log.debug("trainhealth: closing the metrics server failed", exc_info=True)
            self.server = None


def _address_problem(exc: OSError) -> bool:
    """Whether binding failed for the address (unknown, not on this host) rather than for the port."""
    return isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
