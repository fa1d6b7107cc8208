"""One etcd watch on its own gRPC stream: the request that creates it, and its responses.

Guarantees: :class:`WatchStream` returns only responses that carry events
and turns every other outcome into an exception that says what it means:
:class:`~._failures.Retired` (the channel was replaced: watch again),
:class:`~._failures.Compacted`, :class:`~._failures.Transient`, or
:class:`~aioelect.ElectionError` when etcd refuses the watch. Creating and
cancelling the stream is :meth:`Connection.watch`'s job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
from aetcd import rpc

from ...core._backend import Interceptor
from ...core._errors import PermanentBackendError
from ...core._tasks import consume
from ._channel import Channel
from ._failures import Compacted, Retired, Transient, answered

__all__ = ["WatchStream", "check_response", "create_request"]


def create_request(
    key: bytes, *, start_revision: int, range_end: bytes | None, no_put: bool, no_delete: bool
) -> rpc.WatchRequest:
    """The request that creates a watch of ``key`` (to ``range_end``) from ``start_revision``."""
    create = rpc.WatchCreateRequest(key=key, start_revision=start_revision)
    if range_end is not None:
        create.range_end = range_end
    if no_put:
        create.filters.append(rpc.WatchCreateRequest.NOPUT)
    if no_delete:
        create.filters.append(rpc.WatchCreateRequest.NODELETE)
    return rpc.WatchRequest(create_request=create)


def check_response(response: Any, channel: Channel, what: str, retire: Callable[[Channel, Transient], None]) -> Any:
    """Return ``response`` if it is a live watch response, else raise what it means.

    A stream that etcd closed retires ``channel`` (``retire``), so that the
    next request goes to another endpoint.
    """
    if response is grpc.aio.EOF:
        failure = Transient(f"etcd at {channel.endpoint} closed the {what} stream")
        retire(channel, failure)
        raise failure
    if response.compact_revision:
        raise Compacted(int(response.compact_revision))
    if response.canceled:
        reason = str(response.cancel_reason) or "no reason given"
        if "permission denied" in reason:
            raise PermanentBackendError(f"etcd at {channel.endpoint} refused the {what}: {reason}")
        raise Transient(f"etcd at {channel.endpoint} cancelled the {what}: {reason}", answered(reason))
    return response


class WatchStream:
    """One etcd watch on its own gRPC stream; see :meth:`Connection.watch`."""

    def __init__(
        self,
        call: Any,
        channel: Channel,
        failed: Callable[[Exception, str, Channel], Exception],
        retire: Callable[[Channel, Transient], None],
        created_revision: int = 0,
        interceptor: Interceptor | None = None,
    ) -> None:
        self._call = call
        self._channel = channel
        self._failed = failed
        self._retire = retire
        #: The store's revision when etcd created the watch. A watch whose start revision is not above it
        #: may be "unsynced": etcd then sends its events from a background loop, up to 100 ms later.
        self.created_revision = created_revision
        self._interceptor = interceptor
        self._reading: asyncio.Future[Any] | None = None
        self._retired: asyncio.Future[Any] | None = None

    async def next(self) -> Any:
        """The next WatchResponse that carries events.

        Raises :class:`Retired` when the channel was replaced (the stream is
        then dead: open a new watch), :class:`Compacted`, :class:`Transient`,
        or :class:`ElectionError` if etcd refuses the watch.
        """
        while True:
            response = await self._read()
            response = check_response(response, self._channel, "watch", self._retire)
            if response.events:
                return response

    async def _read(self) -> Any:
        """The next response, or :class:`Retired` as soon as the channel is retired.

        The read in flight and the wait for retirement outlive a cancelled
        call (the next call picks them up; :meth:`close` ends them): a
        leader's key watch is cancelled just before it resigns, and ending a
        gRPC read there would delay the resign.
        """
        if self._reading is None:
            interceptor = self._interceptor
            read = self._call.read() if interceptor is None else interceptor.exchange("watch message", self._call.read)
            self._reading = asyncio.ensure_future(read)
        if self._retired is None:
            self._retired = asyncio.ensure_future(self._channel.retired.wait())
        read, retired = self._reading, self._retired
        await asyncio.wait([read, retired], return_when=asyncio.FIRST_COMPLETED)
        if not read.done():
            raise Retired()
        self._reading = None
        if read.cancelled():
            raise Transient("the etcd watch was cancelled (channel closed)")
        try:
            return read.result()
        except Exception as exc:
            failure = self._failed(exc, "watch", self._channel)
            if failure is exc:
                raise
            raise failure from None

    def close(self) -> None:
        """End the read in flight and the wait for retirement (the caller cancels the call itself)."""
        for waiter in (self._reading, self._retired):
            if waiter is not None and not waiter.done():
                waiter.cancel()
            if waiter is not None:
                waiter.add_done_callback(consume)
        self._reading = self._retired = None
