"""The /metrics server under slow, stalled and malformed clients, over real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest
import trustme
from prometheus_client import CollectorRegistry

from tests.helpers import scrape
from trainhealth._internal import catalog
from trainhealth._internal.identity import Identity
from trainhealth._internal.sinks.prometheus import MetricsServer, StoreCollector, TLSFiles
from trainhealth._internal.sinks.serving import ServingLimits
from trainhealth._internal.store import MetricStore


def _server(limits: ServingLimits | None = None, tls: TLSFiles | None = None) -> MetricsServer:
    store = MetricStore()
    store.set(catalog.TRAIN_LOSS, 4.5)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, Identity("job-a", "node-x", 0, 0, 1)))
    return MetricsServer(registry, addr="127.0.0.1", port=0, tls=tls, limits=limits, version=lambda: store.version)


def _connect(server: MetricsServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _closed_by_server(client: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``client`` within ``within_s`` (it reads EOF or a reset)."""
    client.settimeout(within_s)
    try:
        while client.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_many_stalled_and_trickling_clients_take_no_threads_and_a_scrape_still_succeeds():
    server = _server()
    before = threading.active_count()
    clients = [_connect(server) for _ in range(200)]
    trickling = clients[:40]
    try:
        most = threading.active_count()
        for second in range(2):
            for client in trickling:
                client.send(b"GET /metrics HTTP/1.1\r\n"[second : second + 1])
            began = time.perf_counter()
            got = scrape(server.url)
            elapsed = time.perf_counter() - began
            assert got.status == 200 and got.value("trainhealth_train_loss") == 4.5
            assert elapsed < 5
            most = max(most, threading.active_count())
        # the event loop and a fixed pool of workers, whatever the clients do
        assert most - before <= ServingLimits().workers + 1
        assert server.open_connections >= 200
    finally:
        for client in clients:
            client.close()
        server.close()


def test_a_stalled_or_trickling_client_is_dropped_at_its_deadline():
    server = _server(ServingLimits(request_timeout_s=0.5))
    try:
        stalled, trickling = _connect(server), _connect(server)
        began = time.monotonic()
        try:
            for byte in b"GET /metrics HTTP/1.1\r\n":  # a byte every 0.1 s: each read is quick, the request is not
                trickling.send(bytes([byte]))
                time.sleep(0.1)
        except OSError:  # dropped while trickling
            pass
        assert _closed_by_server(stalled, within_s=5)
        assert _closed_by_server(trickling, within_s=5)
        assert time.monotonic() - began < 5
        assert scrape(server.url).status == 200
    finally:
        server.close()


def test_beyond_max_connections_the_oldest_idle_client_gives_way():
    server = _server(ServingLimits(max_connections=8))
    clients = [_connect(server) for _ in range(20)]
    try:
        assert scrape(server.url).status == 200  # a scraper gets through a full house
        time.sleep(0.2)
        assert server.open_connections <= 8
        assert _closed_by_server(clients[0], within_s=5)  # the oldest were dropped
    finally:
        for client in clients:
            client.close()
        server.close()


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"BREW /metrics HTCPCP/1.0\r\n\r\n", b"400"),
        (b"GET /metrics\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Endless: a\r\n" * 6000, b"431"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", b"405"),
        (b"GET /metrics?name[]=trainhealth_train_loss HTTP/1.0\r\nHost: x\r\n\r\n", b"200"),
    ],
)
def test_malformed_requests_get_an_answer_and_the_server_goes_on(request_bytes, status):
    server = _server()
    try:
        with _connect(server) as client:
            client.sendall(request_bytes)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
        assert answer.split(b" ")[1] == status, answer[:200]
        assert b"Connection: close" in answer
        assert scrape(server.url).status == 200
    finally:
        server.close()


def test_a_client_that_half_closes_after_its_request_is_answered():
    server = _server()
    try:
        with _connect(server) as client:
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            client.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 OK") and b"trainhealth_train_loss" in answer
    finally:
        server.close()


def test_stalled_clients_do_not_block_tls(tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = _server(
        ServingLimits(request_timeout_s=1.0), tls=TLSFiles(str(tmp_path / "server.pem"), str(tmp_path / "server.key"))
    )
    before = threading.active_count()
    clients = [_connect(server) for _ in range(50)]  # connect and never start the handshake
    try:
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        assert scrape(server.url, context=context).value("trainhealth_train_loss") == 4.5
        assert threading.active_count() - before <= ServingLimits().workers + 1
        assert _closed_by_server(clients[0], within_s=5)  # the handshake has a deadline too
    finally:
        for client in clients:
            client.close()
        server.close()


def test_close_returns_promptly_with_clients_connected():
    server = _server()
    clients = [_connect(server) for _ in range(20)]
    began = time.monotonic()
    server.close()
    assert time.monotonic() - began < 5
    assert all(_closed_by_server(client, within_s=5) for client in clients)
    for client in clients:
        client.close()


@pytest.mark.parametrize(
    "limits",
    [
        {"workers": 0},
        {"max_connections": 0},
        {"request_timeout_s": float("inf")},
        {"write_timeout_s": 0},
        {"max_request_bytes": 10},
    ],
)
def test_limits_are_checked(limits):
    with pytest.raises(ValueError):
        ServingLimits(**limits)
