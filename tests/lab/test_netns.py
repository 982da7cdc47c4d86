"""NetLab on the real kernel: namespaces, a real TCP transfer, tbf rate limits, cleanup."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainhealth_lab.netns import NetHost, NetLab, NetLabUnavailable

REASON = NetLab.available()
needs_lab = pytest.mark.skipif(REASON is not None, reason=f"NetLab unavailable: {REASON}")
PREFIX = "thtest"
PORT = 47311

SERVER = """
import socket, sys
with socket.create_server((sys.argv[1], int(sys.argv[2]))) as server:
    server.settimeout(30)
    print("ready", flush=True)
    for _ in range(int(sys.argv[3])):
        conn, _ = server.accept()
        with conn:
            conn.settimeout(30)
            while conn.recv(1 << 16):
                pass
            conn.sendall(b"k")
"""

CLIENT = """
import socket, sys, time
payload = b"x" * int(sys.argv[3])
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as conn:
    start = time.perf_counter()
    conn.sendall(payload)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)
    print(time.perf_counter() - start)
"""


def _namespaces() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()


def _throughput_mbit(lab: NetLab, server, size: int) -> float:
    client = subprocess.run(
        lab.command(0, [sys.executable, "-c", CLIENT, lab.hosts[1].address, str(PORT), str(size)]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return size * 8 / 1e6 / float(client.stdout)


def test_hosts_and_commands_without_root():
    lab = NetLab(3, prefix="doc", subnet="10.9.0.0/24")
    assert lab.hosts[2] == NetHost("doc-h2", "10.9.0.12", "eth0")
    assert lab.command(0, ["true"]) == ["ip", "netns", "exec", "doc-h0", "true"]
    with pytest.raises(ValueError, match="hosts"):
        NetLab(0)
    with pytest.raises(ValueError, match="too small"):
        NetLab(10, subnet="10.0.0.0/29")
    with pytest.raises(ValueError, match="prefix"):
        NetLab(2, prefix="a-b")
    with pytest.raises(ValueError, match="host must be"):
        lab.command(3, ["true"])


@needs_lab
def test_rate_limit_slows_a_real_tcp_transfer_and_clear_restores_it():
    rate = 20.0
    with NetLab(2, prefix=PREFIX) as lab:
        assert {host.name for host in lab.hosts} <= set(_namespaces())
        server = subprocess.Popen(
            lab.command(1, [sys.executable, "-c", SERVER, lab.hosts[1].address, str(PORT), "3"]),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout.readline().strip() == "ready"
            before = _throughput_mbit(lab, server, 8 << 20)
            lab.slow_link(1, rate_mbit=rate)
            slowed = _throughput_mbit(lab, server, 4 << 20)
            lab.clear_link(1)
            after = _throughput_mbit(lab, server, 8 << 20)
            server.wait(timeout=30)
        finally:
            server.kill()
            server.wait()
        print(f"before {before:.0f} Mbit/s, at {rate} Mbit/s limit {slowed:.1f}, after clear {after:.0f}")
        # The limit holds, roughly: TCP gets most of the rate and never much more.
        assert 0.6 * rate < slowed < 1.2 * rate
        # It got slower by roughly the factor the limit implies, and clearing restores the link.
        assert before / slowed > 0.5 * before / rate
        assert after > 5 * rate
    assert not [name for name in _namespaces() if name.startswith(f"{PREFIX}-")]


@needs_lab
def test_cleans_up_after_an_error_and_leftovers_of_a_crashed_run():
    subprocess.run(["ip", "netns", "add", f"{PREFIX}-h7"], check=True)  # as if a previous run crashed
    with pytest.raises(KeyError):
        with NetLab(2, prefix=PREFIX) as lab:
            assert f"{PREFIX}-h7" not in _namespaces()
            lab.slow_link(0, rate_mbit=5)
            raise KeyError("boom")
    assert not [name for name in _namespaces() if name.startswith(f"{PREFIX}-")]


@needs_lab
def test_delay_uses_netem_or_says_why_not():
    reason = NetLab.delay_supported()
    with NetLab(2, prefix=PREFIX) as lab:
        if reason is None:
            lab.slow_link(0, delay_ms=5)
            lab.clear_link(0)
        else:
            with pytest.raises(NetLabUnavailable, match="netem|delay"):
                lab.slow_link(0, delay_ms=5)
    assert not [name for name in _namespaces() if name.startswith(f"{PREFIX}-")]
