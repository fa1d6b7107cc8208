"""A fault-injecting TCP proxy on 127.0.0.1: pass bytes, stall them (a silent partition), or drop connections.

It runs on its own daemon thread, so it serves any event loop (or none) and
clients in other processes; every mode change returns only once applied.
"""

from __future__ import annotations

import contextlib
import errno
import queue
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType

from .errors import HarnessError
from .processes import LOOPBACK, track, untrack

__all__ = ["TCPProxy"]

_BUFFER_LIMIT = 256 * 1024


class _Pair:
    __slots__ = (
        "c2u",
        "c2u_late",
        "client",
        "client_eof",
        "client_shut",
        "connecting",
        "source",
        "u2c",
        "u2c_late",
        "upstream",
        "upstream_eof",
        "upstream_shut",
    )

    def __init__(self, client: socket.socket, source: str) -> None:
        self.client = client
        self.source = source  # the client's address
        self.upstream: socket.socket | None = None
        self.connecting = False
        self.c2u = bytearray()
        self.u2c = bytearray()
        # Bytes read while delaying, each chunk with the monotonic time it may be forwarded at.
        self.c2u_late: deque[tuple[float, bytes]] = deque()
        self.u2c_late: deque[tuple[float, bytes]] = deque()
        self.client_eof = False
        self.upstream_eof = False
        self.upstream_shut = False
        self.client_shut = False


def _abort_socket(sock: socket.socket | None) -> None:
    """Close ``sock`` with a TCP RST (SO_LINGER 0)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(OSError):
        sock.close()


class TCPProxy:
    """A fault-injecting TCP proxy from 127.0.0.1:``port`` to ``target``.

    It runs on its own daemon thread, so it works with any event loop (or
    none) and for clients in other processes.  Modes (each method returns
    only once the proxy thread has applied it):

    * :meth:`passthrough` / :meth:`heal` -- forward bytes both ways.  Client
      connections accepted while stalled get their upstream connection now.
    * :meth:`stall` -- silent partition: every connection stays open but no
      byte moves in either direction; new connections are accepted (the
      kernel completes the handshake) and then hang too.  Nothing is lost:
      buffered bytes flow again after :meth:`heal`.
    * :meth:`stall_from` -- :meth:`stall` for the connections from some client
      addresses only (a client bound to 127.0.0.2, say); the rest pass.
    * :meth:`drop` -- every current connection is reset (RST on both sides),
      and new connections are accepted and immediately reset.
    * :meth:`delay` -- forward bytes both ways, each chunk held for the
      given seconds first (a slow link; order kept). :meth:`heal` ends it
      and forwards what is held at once.

    If the target refuses or resets, the client connection is reset too.
    """

    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((LOOPBACK, listen_port))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self._port = int(self._listener.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "listener")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._masks: dict[socket.socket, int] = {}
        self._pairs: list[_Pair] = []
        self._mode = "passthrough"
        self._delay = 0.0
        self._stalled_sources: frozenset[str] = frozenset()
        self._commands: queue.SimpleQueue[tuple[Callable[[], None], threading.Event]] = queue.SimpleQueue()
        self._closed = False
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"aioelect-proxy-{self._port}", daemon=True)
        self._thread.start()
        track(self, self.close)

    # -- public API ------------------------------------------------------------

    host = LOOPBACK

    @property
    def port(self) -> int:
        """Listening port on 127.0.0.1."""
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """``("127.0.0.1", port)``."""
        return (LOOPBACK, self._port)

    @property
    def endpoint(self) -> str:
        """``"127.0.0.1:PORT"``."""
        return f"{LOOPBACK}:{self._port}"

    @property
    def mode(self) -> str:
        """``"passthrough"``, ``"stall"`` or ``"drop"``."""
        return self._mode

    @property
    def connection_count(self) -> int:
        """Client connections currently held by the proxy."""
        return len(self._pairs)

    @property
    def delay_seconds(self) -> float:
        """How long each chunk is held in passthrough (0 unless :meth:`delay`)."""
        return self._delay

    def passthrough(self) -> None:
        """Forward bytes in both directions (the initial mode), without delay."""
        self._call(lambda: self._set_mode("passthrough"))

    def delay(self, seconds: float) -> None:
        """Forward bytes in both directions, each chunk ``seconds`` after it arrived (a slow link)."""
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        self._call(lambda: self._set_mode("passthrough", seconds))

    heal = passthrough

    def stall(self) -> None:
        """Keep connections open but forward nothing (silent partition)."""
        self._call(lambda: self._set_mode("stall"))

    def stall_from(self, *hosts: str) -> None:
        """Forward the connections of every client but those from ``hosts`` (its address), which stay open and
        silent as in :meth:`stall`: a partition of some clients only. :meth:`heal` ends it."""
        self._call(lambda: self._set_mode("passthrough", stalled=frozenset(hosts)))

    def drop(self) -> None:
        """Reset all connections now and reset new ones until healed."""
        self._call(lambda: self._set_mode("drop"))

    def close(self) -> None:
        """Reset all connections, stop listening and stop the thread.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            with contextlib.suppress(TimeoutError):
                self._call(self._request_stop)
            self._thread.join(5.0)
        untrack(self)

    def __enter__(self) -> TCPProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TCPProxy {self.endpoint} -> {self.target[0]}:{self.target[1]} {self._mode}>"

    # -- thread side -------------------------------------------------------------

    def _call(self, func: Callable[[], None], timeout: float = 5.0) -> None:
        if threading.current_thread() is self._thread:
            func()
            return
        if not self._thread.is_alive():
            raise HarnessError(f"proxy thread is not running (error: {self._error!r})")
        done = threading.Event()
        self._commands.put((func, done))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if not done.wait(timeout):
            raise TimeoutError("proxy thread did not respond")

    def _request_stop(self) -> None:
        self._stopping = True

    def _set_mode(self, mode: str, delay: float = 0.0, stalled: frozenset[str] = frozenset()) -> None:
        self._mode = mode
        self._delay = delay
        self._stalled_sources = stalled
        if delay == 0.0:
            self._release_due(float("inf"))
        if mode == "drop":
            for pair in list(self._pairs):
                self._abort(pair)

    def _abort(self, pair: _Pair) -> None:
        for sock in (pair.client, pair.upstream):
            if sock is not None:
                self._set_mask(sock, 0, pair)
        _abort_socket(pair.client)
        _abort_socket(pair.upstream)
        with contextlib.suppress(ValueError):
            self._pairs.remove(pair)

    def _finish(self, pair: _Pair) -> None:
        for sock in (pair.client, pair.upstream):
            if sock is not None:
                self._set_mask(sock, 0, pair)
                with contextlib.suppress(OSError):
                    sock.close()
        with contextlib.suppress(ValueError):
            self._pairs.remove(pair)

    def _set_mask(self, sock: socket.socket, mask: int, pair: _Pair) -> None:
        current = self._masks.get(sock, 0)
        if mask == current:
            return
        try:
            if mask == 0:
                self._sel.unregister(sock)
                del self._masks[sock]
            elif current == 0:
                self._sel.register(sock, mask, pair)
                self._masks[sock] = mask
            else:
                self._sel.modify(sock, mask, pair)
                self._masks[sock] = mask
        except (KeyError, ValueError, OSError):
            self._masks.pop(sock, None)

    def _connect_upstream(self, pair: _Pair) -> None:
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setblocking(False)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = upstream.connect_ex(self.target)
        pair.upstream = upstream
        if err in (0, errno.EISCONN):
            pair.connecting = False
        elif err in (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK):
            pair.connecting = True
        else:
            self._abort(pair)

    def _release_due(self, now: float) -> float | None:
        """Move held chunks that are due into the send buffers; return when the next one is due (or None)."""
        next_due: float | None = None
        for pair in self._pairs:
            for late, buf in ((pair.c2u_late, pair.c2u), (pair.u2c_late, pair.u2c)):
                while late and late[0][0] <= now:
                    buf += late.popleft()[1]
                if late and (next_due is None or late[0][0] < next_due):
                    next_due = late[0][0]
        return next_due

    def _received(self, late: deque[tuple[float, bytes]], buf: bytearray, data: bytes) -> None:
        if self._delay > 0 or late:
            late.append((time.monotonic() + self._delay, data))
        else:
            buf += data

    def _update_interest(self) -> None:
        for pair in list(self._pairs):
            passing = self._mode == "passthrough" and pair.source not in self._stalled_sources
            if passing and pair.upstream is None:
                if pair.client_eof and not pair.c2u and not pair.c2u_late:
                    self._finish(pair)
                    continue
                self._connect_upstream(pair)
                if pair not in self._pairs:
                    continue
            client_mask = 0
            upstream_mask = 0
            if passing:
                if not pair.client_eof and len(pair.c2u) + sum(len(d) for _, d in pair.c2u_late) < _BUFFER_LIMIT:
                    client_mask |= selectors.EVENT_READ
                if pair.u2c:
                    client_mask |= selectors.EVENT_WRITE
                if pair.connecting:
                    upstream_mask = selectors.EVENT_WRITE
                elif pair.upstream is not None:
                    held = len(pair.u2c) + sum(len(d) for _, d in pair.u2c_late)
                    if not pair.upstream_eof and held < _BUFFER_LIMIT:
                        upstream_mask |= selectors.EVENT_READ
                    if pair.c2u:
                        upstream_mask |= selectors.EVENT_WRITE
            self._set_mask(pair.client, client_mask, pair)
            if pair.upstream is not None:
                self._set_mask(pair.upstream, upstream_mask, pair)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                client, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if self._mode == "drop":
                _abort_socket(client)
                continue
            client.setblocking(False)
            with contextlib.suppress(OSError):
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._pairs.append(_Pair(client, addr[0]))

    def _half_close(self, pair: _Pair) -> None:
        if pair.upstream is None or pair.connecting:
            return
        if pair.client_eof and not pair.c2u and not pair.c2u_late and not pair.upstream_shut:
            pair.upstream_shut = True
            with contextlib.suppress(OSError):
                pair.upstream.shutdown(socket.SHUT_WR)
        if pair.upstream_eof and not pair.u2c and not pair.u2c_late and not pair.client_shut:
            pair.client_shut = True
            with contextlib.suppress(OSError):
                pair.client.shutdown(socket.SHUT_WR)
        if pair.upstream_shut and pair.client_shut:
            self._finish(pair)

    def _handle(self, pair: _Pair, sock: socket.socket, mask: int) -> None:
        if pair not in self._pairs or self._mode != "passthrough" or pair.source in self._stalled_sources:
            return
        is_client = sock is pair.client
        if not is_client and pair.connecting:
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._abort(pair)
                return
            pair.connecting = False
            return
        try:
            if mask & selectors.EVENT_READ:
                data = sock.recv(65536)
                if is_client:
                    if data:
                        self._received(pair.c2u_late, pair.c2u, data)
                    else:
                        pair.client_eof = True
                elif data:
                    self._received(pair.u2c_late, pair.u2c, data)
                else:
                    pair.upstream_eof = True
            if mask & selectors.EVENT_WRITE:
                buf = pair.u2c if is_client else pair.c2u
                if buf:
                    sent = sock.send(buf)
                    del buf[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._abort(pair)
            return
        self._half_close(pair)

    def _run(self) -> None:
        try:
            while not self._stopping:
                now = time.monotonic()
                next_due = self._release_due(now)
                self._update_interest()
                timeout = 0.5 if next_due is None else min(0.5, max(0.0, next_due - now))
                for key, mask in self._sel.select(timeout=timeout):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                        self._drain_commands()
                    else:
                        self._handle(key.data, key.fileobj, mask)  # type: ignore[arg-type]
                self._drain_commands()
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            for pair in list(self._pairs):
                self._abort(pair)
            self._drain_commands()
            with contextlib.suppress(Exception):
                self._sel.close()
            for sock in (self._listener, self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    sock.close()

    def _drain_commands(self) -> None:
        while True:
            try:
                func, done = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                func()
            finally:
                done.set()
