"""The /metrics endpoint over real sockets: TLS, mTLS and basic auth accepted and refused as configured."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import urllib.error

import pytest
import trustme
from prometheus_client import CollectorRegistry, generate_latest

from tests.helpers import scrape
from trainhealth._internal import catalog
from trainhealth._internal.config import ConfigError, Settings
from trainhealth._internal.identity import Identity
from trainhealth._internal.sinks.prometheus import StoreCollector
from trainhealth._internal.sinks.service import Sinks
from trainhealth._internal.store import MetricStore

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
    sinks = Sinks.start(
        store,
        IDENTITY,
        Settings.resolve(env={}, prometheus_addr="127.0.0.1", prometheus_port=0, otel=False, **settings),
    )
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
        tls_certfile=pki["server.pem"],
        tls_keyfile=pki["server.key"],
        basic_auth_username="prometheus",
        basic_auth_password_file=str(password_file),
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


def _tls_settings(pki, **files) -> dict[str, str]:
    return {"tls_certfile": pki["server.pem"], "tls_keyfile": pki["server.key"], **files}


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, pki):
    """Files that exist but cannot serve TLS: text, a certificate without its key, an encrypted key."""
    from cryptography.hazmat.primitives import serialization

    root = tmp_path_factory.mktemp("bad")
    (root / "text.pem").write_text("not a PEM file\n")
    (root / "empty.pem").write_text("")
    stranger = trustme.CA().issue_cert("127.0.0.1")
    stranger.private_key_pem.write_to_path(str(root / "stranger.key"))  # a key that is not the certificate's
    key = serialization.load_pem_private_key(open(pki["server.key"], "rb").read(), password=None)
    (root / "encrypted.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    return {name: str(root / name) for name in ("text.pem", "empty.pem", "stranger.key", "encrypted.key")}


@pytest.mark.parametrize(
    "files, setting, problem",
    [
        ({"tls_certfile": "text.pem"}, "tls_certfile", "holds no usable PEM certificate"),
        ({"tls_certfile": "empty.pem"}, "tls_certfile", "holds no usable PEM certificate"),
        ({"tls_certfile": "server.key"}, "tls_certfile", "holds no usable PEM certificate"),
        ({"tls_keyfile": "text.pem"}, "tls_keyfile", "is not a usable private key"),
        ({"tls_keyfile": "stranger.key"}, "tls_keyfile", "is not a usable private key"),
        ({"tls_keyfile": "encrypted.key"}, "tls_keyfile", "the key is encrypted"),
        ({"tls_client_cafile": "text.pem"}, "tls_client_cafile", "holds no usable PEM CA certificate"),
    ],
)
def test_a_tls_file_that_cannot_be_used_names_its_setting(pki, bad_files, files, setting, problem):
    paths = {name: bad_files.get(value) or pki[value] for name, value in files.items()}
    with pytest.raises(ConfigError) as error:
        _start(**_tls_settings(pki, **paths))  # an encrypted key fails at once: no passphrase prompt
    assert error.value.setting == setting
    assert str(error.value).startswith(f"{setting} (TRAINHEALTH_{setting.upper()}): ")
    assert problem in str(error.value)


def test_an_unreadable_tls_file_names_its_setting(pki, tmp_path):
    directory_as_key = tmp_path / "key-dir"
    directory_as_key.mkdir()
    settings = Settings.resolve(
        env={}, prometheus_addr="127.0.0.1", prometheus_port=0, otel=False, **_tls_settings(pki)
    )
    # a file removed (or made unreadable) between reading the settings and starting the server
    moved = tmp_path / "server.key"
    moved.write_bytes(open(pki["server.key"], "rb").read())
    settings = settings.replace(tls_keyfile=str(moved))
    moved.unlink()
    with pytest.raises(ConfigError, match=r"^tls_keyfile \(TRAINHEALTH_TLS_KEYFILE\): cannot read .*server.key"):
        Sinks.start(MetricStore(), IDENTITY, settings)


@pytest.mark.parametrize(
    "addr, shown", [("0.0.0.0", "0.0.0.0"), ("127.0.0.1", "127.0.0.1"), ("localhost", "127.0.0.1")]
)
def test_the_url_says_the_address_bound(addr, shown):
    sinks = Sinks.start(
        MetricStore(), IDENTITY, Settings.resolve(env={}, prometheus_addr=addr, prometheus_port=0, otel=False)
    )
    try:
        assert sinks.metrics_url == f"http://{shown}:{sinks.server.port}/metrics"
        assert sinks.server.host == shown
        assert scrape(sinks.metrics_url).status == 200
    finally:
        sinks.close()


def test_an_ipv6_url_is_bracketed():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        sinks = Sinks.start(
            MetricStore(), IDENTITY, Settings.resolve(env={}, prometheus_addr="::1", prometheus_port=0, otel=False)
        )
    except ConfigError:
        pytest.skip("::1 cannot be bound here")
    try:
        assert sinks.metrics_url == f"http://[::1]:{sinks.server.port}/metrics"
        assert scrape(sinks.metrics_url).status == 200
    finally:
        sinks.close()


@pytest.mark.parametrize("addr", ["192.0.2.1", "no-such-host.invalid", "300.1.1.1"])
def test_an_address_that_cannot_be_bound_names_prometheus_addr(addr):
    with pytest.raises(ConfigError) as error:
        Sinks.start(
            MetricStore(), IDENTITY, Settings.resolve(env={}, prometheus_addr=addr, prometheus_port=0, otel=False)
        )
    assert error.value.setting == "prometheus_addr"
    assert f"cannot serve on {addr}:0" in str(error.value)


def test_a_port_in_use_is_a_configuration_error():
    sinks, _ = _start()
    try:
        with pytest.raises(ConfigError, match=r"^prometheus_port \(TRAINHEALTH_PROMETHEUS_PORT\): cannot serve"):
            Sinks.start(
                MetricStore(),
                IDENTITY,
                Settings.resolve(env={}, prometheus_addr="127.0.0.1", prometheus_port=sinks.server.port, otel=False),
            )
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
