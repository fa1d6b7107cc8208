"""One gRPC channel to one etcd member: created, authenticated, closed.

Built on grpcio's public API (``grpc.aio.insecure_channel`` and
``grpc.aio.secure_channel``) and on the etcd API that aetcd ships generated
as :mod:`aetcd.rpc` (request and reply messages, ``AuthStub``, ``KVStub``,
``LeaseStub``, ``WatchStub``). No aetcd client and no private name of aetcd
is used: the channel, its TLS, its authentication and its lifetime are ours.

Guarantees: a channel is TLS whenever credentials are given (every
reconnection and failover included); :meth:`Channel.authenticate` bounds
its request by its ``timeout``; :meth:`Channel.close` closes the channel's
shared keep-alive stream, then the channel, once, bounded, never
interrupted, and never raises; it returns once gRPC has finished every call
made on the channel (no task of gRPC's is left behind).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import anyio
import grpc
from aetcd import rpc

from ...core._log import ElectionLog
from ._calls import settle
from ._endpoints import Endpoint

__all__ = ["GRPC_OPTIONS", "Channel"]

# gRPC keepalive pings detect a dead or frozen member under a long-lived watch.
# etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
GRPC_OPTIONS = {
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.http2.max_pings_without_data": 0,
    "grpc.max_reconnect_backoff_ms": 1_000,
    # gRPC's default, said here so that no release of grpcio lifts it: a larger reply fails its call
    # (RESOURCE_EXHAUSTED) unread. The election's replies are a few keys of at most 1 KiB each.
    "grpc.max_receive_message_length": 4 << 20,
}
#: How long closing one channel may take before it is left to gRPC.
CLOSE_TIMEOUT = 2.0


class SharedStream(Protocol):
    """A stream that the channel's users share (the keep-alive stream), closed with the channel."""

    @property
    def usable(self) -> bool: ...

    async def close(self) -> None: ...


class Channel:
    """One gRPC channel to one endpoint, the stubs the backend calls on it, and who is using it."""

    def __init__(self, endpoint: Endpoint, credentials: grpc.ChannelCredentials | None) -> None:
        self.endpoint = endpoint
        target = str(endpoint)
        options = list(GRPC_OPTIONS.items())
        if credentials is None:
            self.grpc = grpc.aio.insecure_channel(target, options=options)
        else:
            self.grpc = grpc.aio.secure_channel(target, credentials, options=options)
        # Calls not yet finished by gRPC: closing the channel cancels them but does not wait for them.
        self._calls: set[Any] = set()
        self._all_ended: asyncio.Event | None = None
        self.kv: Any = _Tracked(rpc.KVStub(self.grpc), self)
        self.lease: Any = _Tracked(rpc.LeaseStub(self.grpc), self)
        self.watch: Any = _Tracked(rpc.WatchStub(self.grpc), self)
        #: gRPC metadata of every request: etcd's auth token once authenticated.
        self.metadata: Any = None
        #: Requests and watches running on this channel: it is closed only once none is.
        self.users = 0
        #: Set when the connection has moved to another channel; requests on this one end.
        self.retired = anyio.Event()
        self.closed = False
        #: The one LeaseKeepAlive stream every session of the connection renews its lease on.
        self.keepalives: SharedStream | None = None

    async def authenticate(self, username: str, password: str, timeout: float) -> None:  # noqa: ASYNC109
        """Ask etcd for an auth token (at most ``timeout`` seconds); every later request carries it."""
        request = rpc.AuthenticateRequest(name=username, password=password)
        reply = await rpc.AuthStub(self.grpc).Authenticate(request, timeout=timeout)
        self.metadata = (("token", reply.token),)

    async def close(self, log: ElectionLog) -> None:
        """Close the shared keep-alive stream, then the channel. Idempotent; never interrupted."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            if self.keepalives is not None:
                await self.keepalives.close()
            with anyio.move_on_after(CLOSE_TIMEOUT):
                try:
                    await settle(self.grpc.close())
                    if self._calls:  # cancelled by the close; gRPC ends each in a task of its own
                        self._all_ended = asyncio.Event()
                        await self._all_ended.wait()
                    await asyncio.sleep(0)  # the step in which those tasks return after our callback
                except Exception as exc:
                    log.debug("closing the gRPC channel to %s failed: %r", self.endpoint, exc)

    def started(self, call: Any) -> None:
        """Remember ``call`` until gRPC has finished it (its done callbacks run)."""
        self._calls.add(call)
        call.add_done_callback(self._ended)

    def _ended(self, call: Any) -> None:
        self._calls.discard(call)
        if not self._calls and self._all_ended is not None:
            self._all_ended.set()


class _Tracked:
    """A stub whose every call the channel remembers until gRPC has finished it."""

    def __init__(self, stub: Any, channel: Channel) -> None:
        self._stub = stub
        self._channel = channel

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        channel = self._channel

        def start(*args: Any, **kwargs: Any) -> Any:
            call = method(*args, **kwargs)
            channel.started(call)
            return call

        return start
