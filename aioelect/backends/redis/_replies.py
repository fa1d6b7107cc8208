"""A bound on the size of each reply read from a Redis server, checked before the reply is read.

The election's replies are small: script results (integers and a lock
value of at most a few hundred bytes), ``INFO server``, ``CONFIG GET`` of a
few settings, published lock values, ``CLUSTER SLOTS``. A server that
claims a larger one (a bulk string of 400 MiB, an array of millions of
elements) is refused as soon as its length is read: the connection is
closed and :class:`ReplyTooLarge`, a permanent error, raised. Without it
redis-py reads every claimed byte into memory before anything can look at
the reply.

The bound sits below redis-py's parsers, whichever one a connection uses
(RESP2, RESP3, hiredis, and after a fallback from one to another): each
connection's stream is read through :class:`_Budget`, which counts the
bytes of one reply and refuses a read that would pass :data:`MAX_REPLY`
before it is made.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from ...core._errors import PermanentBackendError

__all__ = ["MAX_REPLY", "ReplyTooLarge", "bounded"]

#: The most bytes one reply may take on the wire (every line and bulk string of it, nested ones included).
MAX_REPLY = 1 << 20


class ReplyTooLarge(PermanentBackendError):
    """A server sent, or announced, a reply larger than :data:`MAX_REPLY` bytes."""


class _Budget:
    """The connection's stream as the parser reads it, counting one reply's bytes (see the module)."""

    def __init__(self, stream: asyncio.StreamReader, where: str) -> None:
        self._stream = stream
        self._where = where
        #: Bytes of the current reply read so far; whether the last read ended with a whole reply.
        self.used = 0
        self.complete = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def _spend(self, size: int, what: str) -> None:
        self.used += size
        if self.used > MAX_REPLY:
            raise ReplyTooLarge(
                f"Redis at {self._where} sent a reply larger than {MAX_REPLY} bytes ({what}): refused, the "
                "connection closed; the election's replies are a few hundred bytes"
            )

    async def readexactly(self, n: int) -> bytes:
        self._spend(n, f"{n} more bytes of a bulk string")
        return await self._stream.readexactly(n)

    async def readline(self) -> bytes:
        try:
            line = await self._stream.readline()
        except ValueError:  # a line longer than the stream's limit (64 KiB): never buffered further
            line = b""
            self._spend(MAX_REPLY + 1, "a line longer than 64 KiB")
        self._spend(len(line), "its lines")
        return line

    async def read(self, n: int = -1) -> bytes:
        data = await self._stream.read(n)
        self._spend(len(data), "its data")
        return data


class _BoundedConnection(AbstractConnection):
    """Put before a redis-py connection class: its stream is read through a :class:`_Budget`, reset per reply."""

    async def _connect(self) -> None:
        await super()._connect()  # type: ignore[safe-super, no-untyped-call, unused-ignore]
        reader = self._reader
        if reader is not None and not isinstance(reader, _Budget):
            where = f"{getattr(self, 'host', '?')}:{getattr(self, 'port', '?')}"
            self._reader = _Budget(reader, where)  # type: ignore[assignment]

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        budget = self._reader
        if not isinstance(budget, _Budget):
            return await super().read_response(*args, **kwargs)
        if budget.complete:
            budget.used = 0
        budget.complete = False
        response = await super().read_response(*args, **kwargs)
        # A read given a timeout returns None when it runs out, maybe halfway through a reply whose bytes the
        # parser keeps: the next read goes on counting them.
        timeout = kwargs.get("timeout", args[1] if len(args) > 1 else None)
        budget.complete = response is not None or timeout is None
        return response


#: The bounded class made for each redis-py connection class.
_CLASSES: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _bounded_class(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    if issubclass(connection_class, _BoundedConnection):
        return connection_class
    made = _CLASSES.get(connection_class)
    if made is None:
        made = _CLASSES[connection_class] = type(
            f"Bounded{connection_class.__name__}", (_BoundedConnection, connection_class), {}
        )
    return made


def bounded(client: Redis) -> Redis:
    """``client``, whose connections (those opened from now on) refuse a reply larger than :data:`MAX_REPLY`."""
    pool = client.connection_pool
    pool.connection_class = _bounded_class(pool.connection_class)
    return client
