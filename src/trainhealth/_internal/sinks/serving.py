"""A bounded HTTP/1.1 server for a WSGI application: the /metrics endpoint's transport.

One event-loop thread holds every connection: it accepts, runs the TLS handshake and
reads the request head, so a client that connects and sends nothing, or trickles its
request a byte at a time, costs a socket and a few bytes, never a thread. A complete
request is answered by a fixed pool of ``workers`` threads. Every connection has
deadlines (``request_timeout_s`` for the handshake and the request head together,
``write_timeout_s`` for the client to take the response), and at most
``max_connections`` are open: beyond that the oldest connection not being answered
is dropped, so stalled clients cannot crowd out a scraper. One request per connection
(``Connection: close``), as the server it replaces did.

>>> import socket, urllib.request
>>> def hello(environ, start_response):
...     start_response("200 OK", [("Content-Type", "text/plain")])
...     return [environ["PATH_INFO"].encode()]
>>> listener = socket.create_server(("127.0.0.1", 0))
>>> server = BoundedHTTPServer(hello, listener)
>>> urllib.request.urlopen(f"http://127.0.0.1:{server.address[1]}/metrics", timeout=5).read()
b'/metrics'
>>> server.close()
"""

from __future__ import annotations

import asyncio
import email.utils
import io
import logging
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

__all__ = ["BoundedHTTPServer", "ServingLimits"]

log = logging.getLogger(__name__)

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")
_REQUEST_LINE = re.compile(r"([A-Z]+) (\S+) HTTP/(1\.[01])")


@dataclass(frozen=True)
class ServingLimits:
    """How much a server gives its clients; every limit is enforced per connection or in total."""

    #: Threads that run the application (rendering /metrics); connections themselves take none.
    workers: int = 2
    #: Open connections at most; beyond it the oldest connection not being answered is dropped.
    max_connections: int = 256
    #: Seconds from accepting a connection to its complete request head (the TLS handshake included).
    request_timeout_s: float = 10.0
    #: Seconds a client has to take the whole response.
    write_timeout_s: float = 10.0
    #: Bytes of request line and headers at most.
    max_request_bytes: int = 65536

    def __post_init__(self) -> None:
        if self.workers < 1 or self.max_connections < 1 or self.max_request_bytes < 256:
            raise ValueError("workers and max_connections must be >= 1 and max_request_bytes >= 256")
        if not (0 < self.request_timeout_s < float("inf") and 0 < self.write_timeout_s < float("inf")):
            raise ValueError("the timeouts must be positive and finite")


class BoundedHTTPServer:
    """Serves ``app`` on the bound socket ``listener`` (it is taken over and closed by :meth:`close`).

    With ``tls``, every connection is wrapped in it (client certificates as the context requires).
    """

    def __init__(
        self,
        app: WSGIApp,
        listener: socket.socket,
        *,
        tls: ssl.SSLContext | None = None,
        limits: ServingLimits | None = None,
        name: str = "trainhealth-http",
    ) -> None:
        self.app = app
        self.tls = tls
        self.limits = limits or ServingLimits()
        self.address: tuple[Any, ...] = listener.getsockname()
        self.scheme = "https" if tls is not None else "http"
        self._connections: dict[_Connection, None] = {}  # open connections, oldest first
        self._executor = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{name}-worker")
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_log_loop_error)
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._closed = False
        listener.setblocking(False)
        self._listener_fd = listener.fileno()
        started = asyncio.run_coroutine_threadsafe(self._start(listener), self._loop)
        try:
            self._server = started.result(timeout=30)
        except BaseException:
            self._stop_loop()
            listener.close()
            raise

    async def _start(self, listener: socket.socket) -> asyncio.AbstractServer:
        return await self._loop.create_server(
            lambda: _Connection(self), sock=listener, backlog=min(self.limits.max_connections, 1024)
        )

    @property
    def open_connections(self) -> int:
        """Connections open now (read on the loop's thread; approximate elsewhere)."""
        return len(self._connections)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, drop every connection and stop the threads; waits at most about ``timeout_s``."""
        if self._closed:
            return
        self._closed = True
        stopped = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        try:
            stopped.result(timeout=timeout_s)
        except Exception:
            log.debug("metrics server: shutting down failed", exc_info=True)
        self._stop_loop(timeout_s)

    async def _shutdown(self) -> None:
        # Stop accepting first but keep the server open: a connection accepted a moment ago is
        # still being made, and before Python 3.12 one made after Server.close() leaks its socket.
        self._loop.remove_reader(self._listener_fd)
        current = asyncio.current_task()
        for _ in range(50):  # connections being made arrive, are refused (self._closed) and abort
            if not [task for task in asyncio.all_tasks() if task is not current]:
                break
            await asyncio.sleep(0)
        for connection in list(self._connections):
            connection.abort()
        self._server.close()  # the listening socket: clients still in its queue are reset
        for _ in range(5):  # an aborted transport closes its socket on the loop's next turns
            await asyncio.sleep(0)

    def _stop_loop(self, timeout_s: float = 5.0) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=timeout_s)
        self._executor.shutdown(wait=False, cancel_futures=True)
        if not self._thread.is_alive():
            self._loop.close()

    # --- called by the connections, on the loop's thread -----------------------------
    def _opened(self, connection: _Connection) -> bool:
        """Register ``connection``; False when it must be refused (closing, or every slot is being answered)."""
        if self._closed:
            return False
        if len(self._connections) >= self.limits.max_connections:
            victim = next((c for c in self._connections if not c.rendering), None)
            if victim is None:
                return False
            log.debug("metrics server: %d connections open, dropping the oldest idle one", len(self._connections))
            victim.abort()
        self._connections[connection] = None
        return True

    def _forget(self, connection: _Connection) -> None:
        self._connections.pop(connection, None)

    def _answer(self, environ: dict[str, Any]) -> Future[bytes]:
        return self._executor.submit(_render, self.app, environ)


class _Connection(asyncio.Protocol):
    """One client: handshake and request head on the loop, the answer from a worker, then close."""

    def __init__(self, server: BoundedHTTPServer) -> None:
        self._server = server
        self._loop = server._loop
        self._transport: Any = None
        self._buffer = bytearray()
        self._reading = True
        self.rendering = False
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        if not self._server._opened(self):
            transport.abort()
            return
        limits = self._server.limits
        self._deadline = self._loop.call_later(limits.request_timeout_s, self.abort)
        if self._server.tls is not None:
            transport.pause_reading()  # the first bytes are the TLS handshake's, not ours
            self._loop.create_task(self._start_tls(transport))

    async def _start_tls(self, transport: Any) -> None:
        try:
            self._transport = await self._loop.start_tls(
                transport,
                self,
                self._server.tls,  # type: ignore[arg-type]  # set by the caller
                server_side=True,
                ssl_handshake_timeout=self._server.limits.request_timeout_s,
            )
        except (Exception, asyncio.CancelledError) as exc:  # refused certificate, timeout, reset, close
            log.debug("metrics server: TLS handshake failed: %r", exc)
            transport.abort()
            self._forget()

    def data_received(self, data: bytes) -> None:
        if not self._reading:
            return  # a request body, or a second request: answered with one response and closed
        self._buffer += data
        end = _END_OF_HEAD.search(self._buffer)
        limit = self._server.limits.max_request_bytes
        if end is None:
            if len(self._buffer) > limit:
                self._reply_now(b"431 Request Header Fields Too Large")
            return
        if end.start() > limit:
            self._reply_now(b"431 Request Header Fields Too Large")
            return
        self._reading = False
        self._transport.pause_reading()
        environ = self._environ(bytes(self._buffer[: end.start()]))
        self._buffer = bytearray()
        if environ is None:
            self._reply_now(b"400 Bad Request")
            return
        self.rendering = True
        answer = self._server._answer(environ)
        answer.add_done_callback(self._answered)

    def _answered(self, answer: Future[bytes]) -> None:
        """On the worker's thread: hand the response to the loop (gone when the server closed meanwhile)."""
        try:
            self._loop.call_soon_threadsafe(self._send, answer)
        except RuntimeError:
            pass

    def _environ(self, head: bytes) -> dict[str, Any] | None:
        lines = head.decode("iso-8859-1").replace("\r\n", "\n").split("\n")
        match = _REQUEST_LINE.fullmatch(lines[0])
        if match is None:
            return None
        method, target, version = match.groups()
        path, _, query = target.partition("?")
        host, port = self._server.address[:2]
        peer = self._transport.get_extra_info("peername") or ("", 0)
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": urllib.parse.unquote(path, "iso-8859-1"),
            "QUERY_STRING": query,
            "SERVER_NAME": str(host),
            "SERVER_PORT": str(port),
            "SERVER_PROTOCOL": f"HTTP/{version}",
            "REMOTE_ADDR": str(peer[0]),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": self._server.scheme,
            "wsgi.input": io.BytesIO(),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                return None
            key = name.upper().replace("-", "_")
            if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                key = "HTTP_" + key
            value = value.strip()
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        return environ

    def _send(self, answer: Future[bytes]) -> None:
        self.rendering = False
        if self._transport is None or self._transport.is_closing():
            return
        try:
            response = answer.result()
        except Exception:  # cancelled at close
            self.abort()
            return
        self._write_and_close(response)

    def _reply_now(self, status: bytes) -> None:
        self._reading = False
        body = status[4:] + b"\n"
        self._write_and_close(
            b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
        )

    def _write_and_close(self, response: bytes) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._loop.call_later(self._server.limits.write_timeout_s, self.abort)
        self._transport.write(response)
        self._transport.close()  # after the buffered response is sent; the deadline aborts a client that never reads

    def eof_received(self) -> bool | None:
        # a client that half-closes after its request still gets the answer (TLS cannot half-close)
        return True if not self._reading and self._server.tls is None else None

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._forget()

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()

    def _forget(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._server._forget(self)


def _render(app: WSGIApp, environ: dict[str, Any]) -> bytes:
    """The whole HTTP response of ``app`` to ``environ``; a failing app answers 500."""
    captured: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        captured["status"], captured["headers"] = status, headers
        return chunks.append

    chunks: list[bytes] = []
    try:
        result = app(environ, start_response)
        try:
            chunks.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = captured["status"], list(captured["headers"])
    except Exception:
        log.debug("metrics server: the application failed", exc_info=True)
        status, headers, chunks = (
            "500 Internal Server Error",
            [("Content-Type", "text/plain; charset=utf-8")],
            [b"internal error\n"],
        )
    body = b"".join(chunks)
    version = "HTTP/1.0" if environ.get("SERVER_PROTOCOL") == "HTTP/1.0" else "HTTP/1.1"
    names = {name.lower() for name, _ in headers}
    if "content-length" not in names:
        headers.append(("Content-Length", str(len(body))))
    if "date" not in names:
        headers.append(("Date", email.utils.formatdate(time.time(), usegmt=True)))
    headers.append(("Connection", "close"))
    head = f"{version} {status}\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers) + "\r\n"
    return head.encode("iso-8859-1") + body


def _log_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    log.debug("metrics server: %s", context.get("message"), exc_info=context.get("exception"))
