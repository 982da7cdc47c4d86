"""Start and stop both sinks — the /metrics endpoint and the OTLP push (metrics, and events
as log records) — over one store."""

from __future__ import annotations

import errno
import importlib.metadata
import logging
import os
import platform
import socket
from collections.abc import Mapping
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

    def __init__(self, server: MetricsServer | None, otel: OtelExporter | None) -> None:
        self.server = server
        self.otel = otel

    @classmethod
    def start(
        cls,
        store: MetricStore,
        identity: Identity,
        settings: Settings,
        env: Mapping[str, str] | None = None,
        events: EventLog | None = None,
    ) -> Sinks:
        """Start what ``settings`` enables.

        A TLS file that cannot be used, an address or a port that cannot be bound raise
        :class:`ConfigError` naming that setting (``tls_keyfile``, ``prometheus_addr``, ``prometheus_port``).
        """
        env = os.environ if env is None else env
        publish_build_info(store)
        server = None
        endpoint = settings.prometheus
        if endpoint.enabled:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(StoreCollector(store, identity))
            tls = None
            if endpoint.tls_certfile and endpoint.tls_keyfile:
                tls = TLSFiles(endpoint.tls_certfile, endpoint.tls_keyfile, endpoint.tls_client_cafile)
            auth = None
            password = endpoint.read_basic_auth_password()
            if endpoint.basic_auth_username and password:
                auth = BasicAuth(endpoint.basic_auth_username, password)
            port = endpoint.metrics_port(identity.local_rank)
            try:
                server = MetricsServer(
                    registry, addr=endpoint.addr, port=port, tls=tls, basic_auth=auth, version=lambda: store.version
                )
            except TLSError as exc:
                raise ConfigError(f"tls_{exc.field}", exc.problem) from None
            except OSError as exc:
                setting = "prometheus_addr" if _address_problem(exc) else "prometheus_port"
                raise ConfigError(setting, f"cannot serve on {endpoint.addr}:{port}: {exc.strerror or exc}") from None
            log.info("trainhealth: serving metrics at %s", server.url)
        otel = None
        if settings.otel.active(env):  # the OpenTelemetry SDK loads only when OTLP is on
            from trainhealth._internal.sinks.otel import OtelExporter

            otel = OtelExporter(store, identity, events=events, close_timeout_s=settings.otel.close_timeout)
        return cls(server, otel)

    @property
    def metrics_url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def close(self) -> None:
        """Push the last OTLP export (waiting at most ``otel_close_timeout``) and stop serving; never raises."""
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
