"""The /metrics endpoint over real sockets: TLS, mTLS and basic auth accepted and refused as configured."""

from __future__ import annotations

import base64
import http.client
import ssl
import urllib.error

import pytest
import trustme
from prometheus_client import CollectorRegistry, generate_latest

from tests.helpers import scrape
from trainhealth import catalog
from trainhealth.config import ConfigError, Settings
from trainhealth.sinks.prometheus import StoreCollector
from trainhealth.sinks.service import Sinks
from trainhealth.identity import Identity
from trainhealth.store import MetricStore

IDENTITY = Identity("job-a", "node-x", 0, 0, 1)
REFUSED = (urllib.error.URLError, ssl.SSLError, ConnectionError, http.client.HTTPException)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1, a client certificate, and one from a stranger CA."""
    root = tmp_path_factory.mktemp("pki")
    ca, stranger = trustme.CA(), trustme.CA()
    files = {}
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(root / "server.pem"))
    server.private_key_pem.write_to_path(str(root / "server.key"))
    for name, issuer in (("client", ca), ("stranger", stranger)):
        cert = issuer.issue_cert(f"{name}@example.org")
        cert.private_key_and_cert_chain_pem.write_to_path(str(root / f"{name}.pem"))
    for name in ("ca.pem", "server.pem", "server.key", "client.pem", "stranger.pem"):
        files[name] = str(root / name)
    return files


def _start(**settings) -> tuple[Sinks, MetricStore]:
    store = MetricStore()
    store.set(catalog.TRAIN_LOSS, 4.5)
    sinks = Sinks.start(store, IDENTITY, Settings.resolve(env={}, prometheus_addr="127.0.0.1", prometheus_port=0, otel=False, **settings))
    return sinks, store


def _client(pki, cert: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki["ca.pem"])
    if cert:
        context.load_cert_chain(pki[cert])
    return context


def test_plain_http_serves_the_store():
    sinks, _ = _start()
    try:
        got = scrape(sinks.metrics_url)
        assert got.status == 200
        assert got.value("trainhealth_train_loss", job="job-a", host="node-x", rank="0") == 4.5
        assert scrape(sinks.metrics_url.replace("/metrics", "/healthz")).text == "ok\n"
        assert scrape(sinks.metrics_url.replace("/metrics", "/nope")).status == 404
    finally:
        sinks.close()


def test_tls_accepts_a_verifying_client_and_refuses_plain_http(pki):
    sinks, _ = _start(tls_certfile=pki["server.pem"], tls_keyfile=pki["server.key"])
    try:
        url = sinks.metrics_url
        assert url.startswith("https://")
        assert scrape(url, context=_client(pki)).value("trainhealth_train_loss") == 4.5
        with pytest.raises(REFUSED):
            scrape(url.replace("https://", "http://"))
        with pytest.raises(REFUSED):  # a client that does not trust the CA
            scrape(url, context=ssl.create_default_context())
    finally:
        sinks.close()


def test_mtls_requires_a_client_certificate_from_the_ca(pki):
    sinks, _ = _start(tls_certfile=pki["server.pem"], tls_keyfile=pki["server.key"], tls_client_cafile=pki["ca.pem"])
    try:
        url = sinks.metrics_url
        assert scrape(url, context=_client(pki, "client.pem")).status == 200
        with pytest.raises(REFUSED):
            scrape(url, context=_client(pki))
        with pytest.raises(REFUSED):
            scrape(url, context=_client(pki, "stranger.pem"))
        # a refused client does not stop the server from serving the next one
        assert scrape(url, context=_client(pki, "client.pem")).status == 200
    finally:
        sinks.close()


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_basic_auth_over_tls(pki, tmp_path):
    password_file = tmp_path / "password"
    password_file.write_text("s3cret-pass\n")
    sinks, _ = _start(
        tls_certfile=pki["server.pem"], tls_keyfile=pki["server.key"],
        basic_auth_username="prometheus", basic_auth_password_file=str(password_file),
    )
    try:
        url, context = sinks.metrics_url, _client(pki)
        refused = scrape(url, context=context)
        assert refused.status == 401
        assert "trainhealth_train_loss" not in refused.text
        assert scrape(url, context=context, headers=_basic("prometheus", "wrong")).status == 401
        assert scrape(url, context=context, headers=_basic("grafana", "s3cret-pass")).status == 401
        assert scrape(url, context=context, headers={"Authorization": "Basic !!!"}).status == 401
        accepted = scrape(url, context=context, headers=_basic("prometheus", "s3cret-pass"))
        assert accepted.status == 200 and accepted.value("trainhealth_train_loss") == 4.5
    finally:
        sinks.close()


def test_basic_auth_without_tls_still_refuses_bad_credentials():
    sinks, _ = _start(basic_auth_username="u", basic_auth_password="p")
    try:
        assert scrape(sinks.metrics_url).status == 401
        assert scrape(sinks.metrics_url, headers=_basic("u", "p")).status == 200
    finally:
        sinks.close()


def test_a_port_in_use_is_a_configuration_error():
    sinks, _ = _start()
    try:
        with pytest.raises(ConfigError, match=r"^prometheus_port \(TRAINHEALTH_PROMETHEUS_PORT\): cannot serve"):
            Sinks.start(MetricStore(), IDENTITY, Settings.resolve(env={}, prometheus_addr="127.0.0.1", prometheus_port=sinks.server.port, otel=False))
    finally:
        sinks.close()


class _SnapshotFailsOnce(MetricStore):
    """A data source whose first snapshot fails, as a corrupted state would."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    def snapshot(self):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("corrupted state")
        return super().snapshot()


def test_a_failing_collector_is_counted_and_the_scrape_still_answers():
    store = _SnapshotFailsOnce()
    store.set(catalog.TRAIN_LOSS, 1.0)
    registry = CollectorRegistry()
    registry.register(StoreCollector(store, IDENTITY))
    first = generate_latest(registry).decode()
    assert "trainhealth_train_loss" not in first
    second = generate_latest(registry).decode()
    assert 'trainhealth_exporter_errors_total{host="node-x",job="job-a",rank="0",source="prometheus"} 1.0' in second
    assert "trainhealth_train_loss{" in second
