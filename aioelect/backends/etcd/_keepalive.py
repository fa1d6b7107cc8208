"""The connection's shared ``LeaseKeepAlive`` stream: every lease renewed on one long-lived stream, as Go's lessor.

Guarantees (detailed on :class:`KeepAliveStream`): a reply is credited only
to the request it answers; a broken stream fails every waiting renewal at
once and is never used again; a stream is closed with its channel.
"""

from __future__ import annotations

import asyncio
import collections
import copy
from typing import Any

import grpc
from aetcd import rpc

from ...core._errors import ElectionError
from ...core._tasks import TaskSet, consume
from ._channel import Channel
from ._connection import Connection
from ._failures import Failure, Transient

__all__ = ["KeepAliveStream", "keepalives"]


def keepalives(conn: Connection, channel: Channel) -> KeepAliveStream:
    """The channel's shared keep-alive stream, opened now if it has none or its last one broke."""
    stream = channel.keepalives
    if not isinstance(stream, KeepAliveStream) or not stream.usable:
        stream = channel.keepalives = KeepAliveStream(conn, channel)
    return stream


def _time_out(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class KeepAliveStream:
    """One long-lived ``LeaseKeepAlive`` stream on one channel, shared by every lease (Go's lessor).

    Guarantees:

    * :meth:`renew` returns the TTL etcd answered for *that* request: replies
      are matched by lease ID, and for one ID in the order the requests went
      out (etcd answers a stream in order), so a reply is never credited to a
      request sent after the one it answers, even when a waiter gave up;
    * a broken stream fails every waiting :meth:`renew` at once (with the
      same :class:`Transient` or :class:`ElectionError`, the channel retired
      if it is to blame) and is never used again: the next renewal opens a
      new stream, on the next endpoint after a failover;
    * :meth:`close` cancels the stream and its two tasks and waits for them.
    """

    def __init__(self, conn: Connection, channel: Channel) -> None:
        self._conn = conn
        self._channel = channel
        self._call: Any = channel.lease.LeaseKeepAlive(metadata=channel.metadata)
        #: Per lease ID, one future per request sent and not yet answered, oldest first.
        self._waiting: dict[int, collections.deque[asyncio.Future[int]]] = {}
        self._outbox: asyncio.Queue[int] = asyncio.Queue()
        self.failure: Exception | None = None
        name = f"aioelect-etcd-keepalive-{channel.endpoint}"
        #: The stream's writer and reader: owned by the stream, cancelled by its failure, awaited by close().
        self._tasks = TaskSet()
        self._tasks.start(self._write(), name=name, on_done=consume)
        self._tasks.start(self._read(), name=name, on_done=consume)

    @property
    def usable(self) -> bool:
        return self.failure is None

    async def renew(self, lease_id: int, timeout: float) -> int:
        """Send one keep-alive for ``lease_id`` and return the TTL etcd answered (<= 0: the lease is gone).

        Raises TimeoutError if no reply came within ``timeout`` seconds (a
        plain timer: this runs for every keep-alive of every lease).
        Cancelled or timed out, the request keeps its place in the reply
        order, so later replies still match their requests.
        """
        if self.failure is not None:
            raise copy.copy(self.failure)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._waiting.setdefault(lease_id, collections.deque()).append(future)
        self._outbox.put_nowait(lease_id)
        timer = loop.call_later(timeout, _time_out, future)
        try:
            return await future
        finally:
            timer.cancel()

    async def _write(self) -> None:
        try:
            while True:
                lease_id = await self._outbox.get()
                await self._call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
        except Exception as exc:
            self._fail(exc)

    async def _read(self) -> None:
        try:
            while True:
                reply = await self._call.read()
                if reply is grpc.aio.EOF:
                    raise Transient(f"etcd at {self._channel.endpoint} closed the keep-alive stream")
                waiters = self._waiting.get(int(reply.ID))
                if not waiters:
                    continue  # a reply to a request of an earlier stream cannot come here: ignore the stray
                future = waiters.popleft()
                if not waiters:
                    del self._waiting[int(reply.ID)]
                if not future.done():  # a waiter that gave up keeps its place, and is skipped here
                    future.set_result(int(reply.TTL))
        except asyncio.CancelledError:
            # Ours (close) or grpc's (the channel closed under the call): nobody may wait for a reply any more.
            self._fail(Transient(f"the keep-alive stream to {self._channel.endpoint} was cancelled"))
            raise
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        if self.failure is not None:
            return
        # Classified as any request's failure: a transient one retires the channel, so the next renewal fails over.
        failure = self._conn.failed(exc, "lease keep-alive", self._channel)
        if failure is exc and not isinstance(exc, (Transient, ElectionError)):
            failure = Transient(f"lease keep-alive on {self._channel.endpoint} failed: {exc!r}")
        self.failure = failure
        self._call.cancel()
        for waiters in self._waiting.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(copy.copy(failure))
        self._waiting.clear()
        self._tasks.cancel()

    async def close(self) -> None:
        """Cancel the stream; waiting renewals raise :class:`Transient`. Never interrupted."""
        self._fail(Transient(f"the keep-alive stream to {self._channel.endpoint} was closed", Failure.STREAM_ENDED))
        await self._tasks.wait()
