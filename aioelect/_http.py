"""A small HTTP/1.1 server for probes and metrics, bounded so that no client can starve the process that runs it.

The health probes (:mod:`aioelect.integrations.health`), ``aioelect run
--metrics-port`` and :meth:`aioelect.metrics.PrometheusMetrics.serve` serve
from it. It runs in the caller's event loop and guarantees:

* at most ``max_connections`` connections are open at once (by default
  :data:`MAX_CONNECTIONS`, and never more than an eighth of the process's
  file-descriptor limit); a connection beyond that is closed (reset) as soon
  as it is accepted, so the server holds at most ``max_connections + 1``
  descriptors and the rest of the process keeps the others;
* one peer cannot take them all: a peer (an IPv4 address; an IPv6 /64
  network) holds at most a quarter of ``max_connections`` at once, and the
  last quarter is kept for peers that hold none, so a prober from another
  address finds a slot while one client, or three, hold all they may and
  reopen each connection the moment it is dropped (below 4 connections,
  neither limit applies);
* each connection gets one answer and is closed: its request head must
  arrive within ``head_timeout`` seconds (:data:`HEAD_TIMEOUT`, never more
  than ``request_timeout``) and be at most :data:`MAX_REQUEST` bytes, and
  the answer is written within ``request_timeout`` seconds, so a client that
  sends nothing or reads nothing holds its slot for a bounded time;
* accepting yields to the event loop after every connection, so a client
  that reconnects as fast as it can does not stall the election;
* an accept that fails (out of file descriptors, out of memory) is retried
  after :data:`ACCEPT_RETRY_DELAY` seconds and logged at most once per
  :data:`ERROR_LOG_INTERVAL` seconds, one line without a traceback, with the
  number of failures it stands for.

The limits by address protect the probes from a client that reaches the
port from its own addresses; a client with many addresses (an IPv4 botnet,
several IPv6 /64 networks) can still fill the slots for as long as it
keeps at it: bind the servers to an address only the prober reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import math
import resource
import socket
import struct
import time
from collections.abc import Awaitable, Callable

import anyio

from .core._tasks import TaskSet

__all__ = [
    "ACCEPT_RETRY_DELAY",
    "ERROR_LOG_INTERVAL",
    "HEAD_TIMEOUT",
    "MAX_CONNECTIONS",
    "MAX_REQUEST",
    "REQUEST_TIMEOUT",
    "BoundedHTTPServer",
    "Handler",
    "connection_cap",
]

#: The most connections served at once by default.
MAX_CONNECTIONS = 32
#: Seconds a client has to read the answer (and at most to send its request head).
REQUEST_TIMEOUT = 5.0
#: Seconds a client has to send its whole request line and headers once connected.
HEAD_TIMEOUT = 2.0
#: The largest request head read (bytes); a longer one is refused with 431.
MAX_REQUEST = 8192
#: Seconds before an accept that failed is tried again.
ACCEPT_RETRY_DELAY = 0.5
#: Seconds between two log lines about failed accepts.
ERROR_LOG_INTERVAL = 10.0

#: ``(method, path)`` to ``(status code, content type, body)``; only GET and HEAD reach it.
Handler = Callable[[str, str], Awaitable[tuple[int, str, bytes]]]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Too Large",
    503: "Down",
}
_JSON = "application/json"


def connection_cap(wanted: int = MAX_CONNECTIONS) -> int:
    """``wanted``, lowered to an eighth of the soft file-descriptor limit (at least 1)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft // 8))


def _peer(address: object) -> str:
    """Who a connection comes from, as its limit counts it: the IPv4 address, or the /64 of an IPv6 one."""
    host = address[0] if isinstance(address, tuple) and address else str(address)
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return str(host)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` at once with a TCP reset: no TIME_WAIT, no lingering descriptor."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class BoundedHTTPServer:
    """Answers ``GET`` and ``HEAD`` with ``handler`` on one address; see the module for its bounds.

    Failed accepts are logged on ``log`` (default: the logger ``aioelect.<name>``).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        name: str,
        max_connections: int | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        head_timeout: float = HEAD_TIMEOUT,
        log: logging.Logger | None = None,
    ) -> None:
        if max_connections is not None and (isinstance(max_connections, bool) or max_connections < 1):
            raise ValueError(f"max_connections must be an integer >= 1, not {max_connections!r}")
        if not (0 < request_timeout < math.inf):
            raise ValueError(f"request_timeout must be a finite number > 0, not {request_timeout!r}")
        if not (0 < head_timeout < math.inf):
            raise ValueError(f"head_timeout must be a finite number > 0, not {head_timeout!r}")
        self.handler = handler
        self.name = name
        self.max_connections = connection_cap(max_connections or MAX_CONNECTIONS)
        self.request_timeout = float(request_timeout)
        self.head_timeout = float(head_timeout)
        share = self.max_connections // 4
        #: The most connections one peer holds at once.
        self.max_per_peer = share or self.max_connections
        #: Slots only a peer that holds no connection may take.
        self.reserved = share
        #: Connections closed at once: ``max_connections`` were open, or their peer held its share.
        self.refused = 0
        #: Accepts that failed (each retried).
        self.accept_errors = 0
        self._log = log if log is not None else logging.getLogger(f"aioelect.{name}")
        self._sock: socket.socket | None = None
        self._starting = False
        #: The accept loop and one task per open connection, cancelled and awaited by aclose().
        self._tasks = TaskSet()
        #: Open connections per peer address.
        self._by_peer: dict[str, int] = {}
        self._unlogged = 0
        self._logged_at = -math.inf

    @property
    def port(self) -> int:
        if self._sock is None:
            raise RuntimeError(f"{self.name} server is not started")
        return int(self._sock.getsockname()[1])

    @property
    def open_connections(self) -> int:
        return sum(self._by_peer.values())

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port``; OSError if it cannot."""
        if self._sock is not None or self._starting:
            raise RuntimeError(f"{self.name} server started twice")
        self._starting = True  # before the first wait: a second start() meanwhile would listen again
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        finally:
            self._starting = False
        family, _, _, _, address = infos[0]
        sock = socket.create_server(address[:2], family=family, backlog=128)
        sock.setblocking(False)
        self._sock = sock
        self._tasks.start(self._accept_loop(sock), name=f"aioelect-{self.name}-accept", on_done=self._ended)

    async def aclose(self) -> None:
        """Stop listening and close every connection. Idempotent."""
        sock, self._sock = self._sock, None
        self._tasks.cancel()
        if not await self._tasks.wait(timeout=5):
            left = len(self._tasks)
            self._log.error("%s server: %d task(s) still running 5 s after they were cancelled", self.name, left)
        if sock is not None:
            sock.close()

    # --- accepting ------------------------------------------------------------------------------

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(sock)
            except OSError as exc:
                self._accept_failed(exc)
                await asyncio.sleep(ACCEPT_RETRY_DELAY)
                continue
            peer = _peer(address)
            if not self._admits(peer):
                self.refused += 1
                _reset(conn)
            else:
                conn.setblocking(False)
                self._by_peer[peer] = self._by_peer.get(peer, 0) + 1
                gone = functools.partial(self._gone, peer)
                self._tasks.start(self._serve(conn), name=f"aioelect-{self.name}-connection", on_done=gone)
            # sock_accept() does not yield while connections are queued: a client reconnecting in a loop would
            # otherwise keep the event loop, and the election in it, from running.
            await asyncio.sleep(0)

    def _admits(self, peer: str) -> bool:
        """Whether a connection from ``peer`` may have a slot now (see the module's limits)."""
        total, held = self.open_connections, self._by_peer.get(peer, 0)
        if total >= self.max_connections or held >= self.max_per_peer:
            return False
        return held == 0 or total < self.max_connections - self.reserved

    def _gone(self, peer: str, task: asyncio.Task[None]) -> None:
        left = self._by_peer.get(peer, 1) - 1
        if left > 0:
            self._by_peer[peer] = left
        else:
            self._by_peer.pop(peer, None)
        self._ended(task)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """Log what a task of the server raised (a connection's is answered, so this is a bug), never lose it."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._log.error("%s server: %s failed: %r", self.name, task.get_name(), exc)

    def _accept_failed(self, exc: OSError) -> None:
        self.accept_errors += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at < ERROR_LOG_INTERVAL:
            return
        self._log.warning(
            "%s server: %d accept(s) failed (last: %s); retrying every %gs, logged at most every %gs",
            self.name,
            self._unlogged,
            exc.strerror or exc,
            ACCEPT_RETRY_DELAY,
            ERROR_LOG_INTERVAL,
        )
        self._unlogged = 0
        self._logged_at = now

    # --- one connection ---------------------------------------------------------------------------

    async def _serve(self, conn: socket.socket) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=MAX_REQUEST)
            code, content_type, body, head_only = await self._handle(reader)
            head = (
                f"HTTP/1.1 {code} {_REASONS.get(code, 'Status')}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Cache-Control: no-store\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode("ascii") + (b"" if head_only else body))
            with anyio.move_on_after(self.request_timeout):
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to answer
        finally:
            if writer is not None and writer.transport.get_write_buffer_size():
                writer.transport.abort()  # a client that reads nothing must not keep the descriptor
            elif writer is not None:
                writer.close()
            else:
                conn.close()

    async def _handle(self, reader: asyncio.StreamReader) -> tuple[int, str, bytes, bool]:
        within = min(self.head_timeout, self.request_timeout)
        try:
            with anyio.fail_after(within):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            return _error(408, f"request not received within {within:g}s")
        except asyncio.LimitOverrunError:
            await _discard(reader)  # closing with unread data would reset the connection before the answer
            return _error(431, f"request head longer than {MAX_REQUEST} bytes")
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _error(400, "malformed request line")
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            return _error(405, "only GET and HEAD")
        code, content_type, body = await self.handler(method, target.split("?", 1)[0])
        return code, content_type, body, method == "HEAD"


def _error(code: int, message: str) -> tuple[int, str, bytes, bool]:
    return code, _JSON, b'{"error": "' + message.encode("ascii") + b'"}\n', False


async def _discard(reader: asyncio.StreamReader) -> None:
    """Read and drop what the client sent (at most 1 MiB, 0.2 s)."""
    dropped = 0
    with anyio.move_on_after(0.2):
        while dropped < 1 << 20 and (chunk := await reader.read(65536)):
            dropped += len(chunk)
