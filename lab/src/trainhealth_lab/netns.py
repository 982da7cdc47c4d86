"""A small real network of Linux network namespaces, for injecting real link faults.

``NetLab(hosts=4)`` creates one network namespace per host (``th-h0``, ``th-h1``, ...), each
holding the end of a veth pair called ``eth0`` with an address from ``subnet``; the other
ends are ports of a bridge that lives in a namespace of its own (``th-br``), so nothing is
added to the root namespace and traffic between hosts never leaves the lab. Processes run
inside a host with ``lab.command(i, argv)`` (``ip netns exec``). ``slow_link`` shapes one
host's link in both directions with ``tc``: a ``tbf`` rate limit, a ``netem`` delay (where
the kernel has ``sch_netem``), or both; it can be switched on while a run is in progress.

Everything the lab creates is removed on exit, after errors too, and entering a lab first
removes what a crashed run with the same ``prefix`` left behind. It needs root, ``ip`` and
``tc`` (iproute2); :meth:`NetLab.available` says why when it cannot work.

>>> lab = NetLab(2, prefix="doc")
>>> [(host.name, host.address, host.interface) for host in lab.hosts]
[('doc-h0', '10.213.0.10', 'eth0'), ('doc-h1', '10.213.0.11', 'eth0')]
>>> lab.command(1, ["ping", "-c1", "10.213.0.10"])
['ip', 'netns', 'exec', 'doc-h1', 'ping', '-c1', '10.213.0.10']
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

__all__ = ["NetHost", "NetLab", "NetLabUnavailable"]

#: Host ``i`` gets the address ``network + FIRST_HOST_OFFSET + i``.
FIRST_HOST_OFFSET = 10
#: Name of the veth end inside every host namespace.
HOST_INTERFACE = "eth0"
_BRIDGE = "br0"
_COMMAND_TIMEOUT_S = 20.0
_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,9}$")


class NetLabUnavailable(RuntimeError):
    """The lab cannot run here; the message says why (not root, no ``ip``, no netem, ...)."""


@dataclass(frozen=True)
class NetHost:
    """One host of the lab: its namespace ``name``, its ``address`` and the veth end ``interface`` inside it."""

    name: str
    address: str
    interface: str


def _tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (path for path in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.access(path, os.X_OK)), None
    )


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetLabUnavailable(f"{' '.join(argv)}: {exc}") from None
    if check and result.returncode != 0:
        raise NetLabUnavailable(f"{' '.join(argv)}: {result.stderr.strip() or f'exit status {result.returncode}'}")
    return result


def _tools() -> tuple[str, str]:
    if os.geteuid() != 0:
        raise NetLabUnavailable("network namespaces need root (run as root, or in a container with CAP_NET_ADMIN)")
    ip, tc = _tool("ip"), _tool("tc")
    if ip is None:
        raise NetLabUnavailable("the 'ip' command (iproute2) is not installed")
    if tc is None:
        raise NetLabUnavailable("the 'tc' command (iproute2) is not installed")
    return ip, tc


def _namespaces(ip: str) -> list[str]:
    listing = _run([ip, "netns", "list"]).stdout
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def _try_qdisc(qdisc: Sequence[str]) -> str | None:
    """Add ``qdisc`` to a veth in a throwaway namespace; None when that works, else the reason."""
    try:
        ip, tc = _tools()
    except NetLabUnavailable as exc:
        return str(exc)
    scratch = f"thcheck{os.getpid()}"
    try:
        _run([ip, "netns", "add", scratch])
    except NetLabUnavailable as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _run([ip, "-n", scratch, "link", "add", "chk0", "type", "veth", "peer", "name", "chk1"])
        _run([ip, "-n", scratch, "link", "set", "chk0", "up"])
        _run([tc, "-n", scratch, "qdisc", "add", "dev", "chk0", "root", *qdisc])
    except NetLabUnavailable as exc:
        return str(exc)
    finally:
        _run([ip, "netns", "delete", scratch], check=False)
    return None


class NetLab:
    """A bridge and ``hosts`` namespaces joined to it by veth pairs (a context manager).

    ``prefix`` names everything the lab creates (``<prefix>-h<i>``, ``<prefix>-br``): two labs
    running at once need different prefixes, and a lab removes leftovers of its own prefix.
    """

    def __init__(self, hosts: int, *, prefix: str = "th", subnet: str = "10.213.0.0/24") -> None:
        if not isinstance(hosts, int) or hosts < 1:
            raise ValueError(f"hosts must be a positive integer, got {hosts!r}")
        if not _PREFIX.match(prefix):
            raise ValueError(f"prefix must be 1-10 letters or digits starting with a letter, got {prefix!r}")
        try:
            network = ipaddress.IPv4Network(subnet)
        except ValueError as exc:
            raise ValueError(f"subnet {subnet!r}: {exc}") from None
        if FIRST_HOST_OFFSET + hosts >= network.num_addresses - 1:
            raise ValueError(
                f"subnet {subnet} is too small for {hosts} hosts (they start at offset {FIRST_HOST_OFFSET})"
            )
        self.prefix = prefix
        self.subnet = str(network)
        self._prefixlen = network.prefixlen
        self.bridge_namespace = f"{prefix}-br"
        self.hosts: tuple[NetHost, ...] = tuple(
            NetHost(f"{prefix}-h{index}", str(network.network_address + FIRST_HOST_OFFSET + index), HOST_INTERFACE)
            for index in range(hosts)
        )
        self._created: list[str] = []
        self._ip = self._tc = ""
        self._delay_reason: str | None | bool = False  # False: not checked yet

    # -- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> NetLab:
        self._ip, self._tc = _tools()
        self._remove_leftovers()
        try:
            self._build()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._teardown()

    def _mine(self, name: str) -> bool:
        return name == self.bridge_namespace or re.fullmatch(rf"{re.escape(self.prefix)}-h\d+", name) is not None

    def _remove_leftovers(self) -> None:
        for name in _namespaces(self._ip):
            if self._mine(name):
                _run([self._ip, "netns", "delete", name], check=False)

    def _add_namespace(self, name: str) -> None:
        _run([self._ip, "netns", "add", name])
        self._created.append(name)
        _run([self._ip, "-n", name, "link", "set", "lo", "up"])

    def _build(self) -> None:
        ip, bridge_ns = self._ip, self.bridge_namespace
        self._add_namespace(bridge_ns)
        _run([ip, "-n", bridge_ns, "link", "add", _BRIDGE, "type", "bridge"])
        _run([ip, "-n", bridge_ns, "link", "set", _BRIDGE, "up"])
        for index, host in enumerate(self.hosts):
            port = self._bridge_port(index)
            self._add_namespace(host.name)
            _run(
                [
                    ip,
                    "-n",
                    bridge_ns,
                    "link",
                    "add",
                    port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    host.interface,
                    "netns",
                    host.name,
                ]
            )
            _run([ip, "-n", bridge_ns, "link", "set", port, "master", _BRIDGE])
            _run([ip, "-n", bridge_ns, "link", "set", port, "up"])
            _run([ip, "-n", host.name, "addr", "add", f"{host.address}/{self._prefixlen}", "dev", host.interface])
            _run([ip, "-n", host.name, "link", "set", host.interface, "up"])

    def _teardown(self) -> None:
        while self._created:
            _run([self._ip, "netns", "delete", self._created.pop()], check=False)
        if self._ip:
            self._remove_leftovers()

    # -- use ---------------------------------------------------------------------------------------

    @staticmethod
    def _bridge_port(index: int) -> str:
        return f"v{index}"

    def _host(self, host: int) -> NetHost:
        if not isinstance(host, int) or not 0 <= host < len(self.hosts):
            raise ValueError(f"host must be an index in 0..{len(self.hosts) - 1}, got {host!r}")
        return self.hosts[host]

    def command(self, host: int, argv: list[str]) -> list[str]:
        """``argv`` prefixed to run inside the namespace of host ``host``."""
        return ["ip", "netns", "exec", self._host(host).name, *argv]

    def _link_ends(self, host: int) -> list[tuple[str, str]]:
        """(namespace, device) of both ends: egress from the host and egress towards it."""
        return [(self._host(host).name, HOST_INTERFACE), (self.bridge_namespace, self._bridge_port(host))]

    def slow_link(self, host: int, *, rate_mbit: float | None = None, delay_ms: float | None = None) -> None:
        """Shape host ``host``'s link in both directions; replaces any shaping already there.

        ``rate_mbit`` caps each direction with ``tbf``; ``delay_ms`` delays each direction with
        ``netem`` (a round trip through the link grows by twice that). Raises
        :class:`NetLabUnavailable` for a delay where this kernel has no ``netem``.
        """
        self._host(host)
        if rate_mbit is None and delay_ms is None:
            raise ValueError("slow_link needs rate_mbit, delay_ms or both")
        if rate_mbit is not None and not rate_mbit > 0:
            raise ValueError(f"rate_mbit must be positive, got {rate_mbit!r}")
        if delay_ms is not None and not delay_ms >= 0:
            raise ValueError(f"delay_ms must be zero or positive, got {delay_ms!r}")
        if not self._created:
            raise RuntimeError("the lab is not running: use it as a context manager")
        if delay_ms is not None:
            if self._delay_reason is False:
                self._delay_reason = NetLab.delay_supported()
            if self._delay_reason is not None:
                raise NetLabUnavailable(f"cannot delay a link here: {self._delay_reason}")
        for namespace, device in self._link_ends(host):
            self._clear(namespace, device)
            tc = [self._tc, "-n", namespace, "qdisc", "add", "dev", device]
            tbf: list[str] = []
            if rate_mbit is not None:
                rate_bytes = rate_mbit * 1e6 / 8
                burst = max(32 * 1024, int(rate_bytes / 100))  # 10 ms of traffic, at least 32 KiB
                tbf = ["tbf", "rate", f"{rate_mbit * 1000:.0f}kbit", "burst", str(burst), "latency", "100ms"]
            if delay_ms is not None:
                _run([*tc, "root", "handle", "1:", "netem", "delay", f"{delay_ms * 1000:.0f}us", "limit", "10000"])
                if tbf:
                    _run([*tc, "parent", "1:1", "handle", "10:", *tbf])
            else:
                _run([*tc, "root", "handle", "1:", *tbf])

    def clear_link(self, host: int) -> None:
        """Remove any shaping of host ``host``'s link."""
        for namespace, device in self._link_ends(host):
            self._clear(namespace, device)

    def _clear(self, namespace: str, device: str) -> None:
        shown = _run([self._tc, "-n", namespace, "qdisc", "show", "dev", device]).stdout
        if re.search(r"\b(tbf|netem)\b", shown):
            _run([self._tc, "-n", namespace, "qdisc", "del", "dev", device, "root"])

    # -- checks ------------------------------------------------------------------------------------

    @staticmethod
    def available() -> str | None:
        """None when a lab can run here, else the reason (root, iproute2, namespaces, veth, tbf)."""
        return _try_qdisc(["tbf", "rate", "10mbit", "burst", "32kbit", "latency", "50ms"])

    @staticmethod
    def delay_supported() -> str | None:
        """None when ``netem`` delays work in this kernel (tried on a throwaway veth), else the reason."""
        reason = _try_qdisc(["netem", "delay", "10ms"])
        if reason is not None and "unknown" in reason.lower():
            return f"this kernel has no netem qdisc (sch_netem): {reason}"
        return reason
