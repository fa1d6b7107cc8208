"""The first sign that PostgreSQL ends a session: its FATAL error, read off the wire before the driver sees it.

A backend ended by ``pg_terminate_backend`` (or a shutdown) sends its client
a FATAL ``ErrorResponse``, *then* frees the session's locks, then closes the
socket. asyncpg reports the end only once the socket closes, after the locks
are free: a candidate elsewhere could lead first. :class:`EndWatch` sits
between the transport and asyncpg's protocol, forwards every call unchanged,
and reports the FATAL message as it arrives.

Guarantees: the bytes asyncpg receives are exactly those it would have
received; ``ended`` is called at most once, on a FATAL or PANIC error
message, on the end of the stream or on the connection lost. A message it
cannot frame (a length out of bounds) makes it stop looking at messages, so
that only the connection's end is reported from then on.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["EndWatch"]

_HEADER = 5  # a type byte, then the length of the rest (itself included) as a big-endian int32
#: An ErrorResponse no larger than this is read whole; a larger one is skipped (a server's are far smaller).
_MAX_ERROR = 64 * 1024
_ENDING = (b"FATAL", b"PANIC")


class EndWatch(asyncio.Protocol):
    """Wraps ``inner`` (the driver's protocol) on the transport; ``ended()`` on the first sign of the session's end."""

    def __init__(self, inner: Any, ended: Callable[[], None]) -> None:
        self._inner = inner
        self._ended = ended
        self._said = False
        self._framing = True
        self._buffer = bytearray()  # a message header, or an error message, not yet whole
        self._skip = 0  # bytes left of a message that is not looked at

    def __getattr__(self, name: str) -> Any:  # anything else the transport asks of the protocol
        return getattr(self._inner, name)

    def _end(self) -> None:
        if not self._said:
            self._said = True
            self._ended()

    def data_received(self, data: bytes) -> None:
        if self._framing:
            try:
                self._scan(data)
            except Exception:  # never let the watch break the driver's own reading
                self._framing = False
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        try:
            return self._inner.eof_received()  # type: ignore[no-any-return]
        finally:
            self._end()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._inner.connection_lost(exc)
        finally:
            self._end()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def _scan(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._skip:
                taken = min(self._skip, len(view))
                self._skip -= taken
                view = view[taken:]
                continue
            if len(self._buffer) < _HEADER:
                taken = min(_HEADER - len(self._buffer), len(view))
                self._buffer += view[:taken]
                view = view[taken:]
                if len(self._buffer) < _HEADER:
                    return
            kind = self._buffer[0:1]
            (length,) = struct.unpack("!i", self._buffer[1:_HEADER])
            body = length - 4
            if body < 0:
                self._framing = False
                return
            if kind != b"E" or body > _MAX_ERROR:
                self._buffer.clear()
                self._skip = body
                continue
            taken = min(body - (len(self._buffer) - _HEADER), len(view))
            self._buffer += view[:taken]
            view = view[taken:]
            if len(self._buffer) - _HEADER < body:
                return
            fields = bytes(self._buffer[_HEADER:])
            self._buffer.clear()
            if _severity(fields) in _ENDING:
                self._end()


def _severity(fields: bytes) -> bytes | None:
    """The severity of an ErrorResponse body (its ``V`` field, never translated; else ``S``)."""
    found: dict[int, bytes] = {}
    for field in fields.split(b"\x00"):
        if field:
            found.setdefault(field[0], field[1:])
    return found.get(ord("V"), found.get(ord("S")))
