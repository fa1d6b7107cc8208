"""The elector's one connection to etcd: one channel at a time, failover between endpoints, watches.

Guarantees (detailed on :class:`Connection`): every request is bounded in
time and classified (:mod:`._failures`); a transient failure moves the next
request to the next endpoint; a permanent one, or a connection that can
never work as configured (:mod:`._probe`), raises
:class:`~aioelect.ElectionError` at once; a channel is closed only once
nothing uses it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import grpc

from ...core._backend import Interceptor, monotonic
from ...core._config import is_loopback, transport_warning
from ...core._errors import BackendUnavailable, ElectionError, ElectorClosed, PermanentBackendError
from ...core._log import ElectionLog
from ._admission import Admission, Lane
from ._calls import settle
from ._channel import Channel
from ._endpoints import Endpoint
from ._failures import Retired, Transient, classify, rpc_error
from ._probe import diagnose_tls
from ._tls import EtcdTLS
from ._watch import WatchStream, check_response, create_request

__all__ = ["DRAIN_TIMEOUT", "Connection", "SelfBounded"]

T = TypeVar("T")

#: How long :meth:`Connection.aclose` lets requests in flight finish before closing under them.
DRAIN_TIMEOUT = 1.0


@dataclass(frozen=True)
class SelfBounded(Generic[T]):
    """A request that awaits no gRPC call itself (only futures of ours) and bounds itself by the call's timeout
    (raising TimeoutError): :meth:`Connection.call` runs it as it is."""

    run: Callable[[Channel], Awaitable[T]]


class Connection:
    """The elector's one connection to etcd: one gRPC channel at a time, failing over between endpoints.

    Guarantees:

    * every request is bounded in time;
    * a transient failure retires the current channel, so the next request
      goes to the next endpoint and every watch waiting on the old channel
      moves over (it raises :class:`Retired`); it is raised as :class:`Transient`;
    * a permanent failure (wrong credentials, permission denied) raises
      :class:`ElectionError` at once; so does a connection that can never
      work as configured (a refused or untrusted certificate, TLS on one
      side only), found by :func:`diagnose_tls` on an endpoint that never
      answered: such a failure is not an unreachable etcd;
    * a channel is closed only once no request or watch uses it, so nothing is
      cancelled under a caller; :meth:`aclose` closes them all (after letting
      requests in flight end for at most ``DRAIN_TIMEOUT``; watches end at once);
    * a request or watch given a ``lane`` waits for its turn in
      :attr:`admission` first (:mod:`._admission`): at most
      :data:`~._admission.LIMIT` of them are in flight at once, a watch only
      until etcd acknowledged it. The wait is not part of the request's
      ``timeout``; a request without a lane never waits.
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        username: str | None,
        password: str | None,
        connect_timeout: float,
        log: Callable[[], ElectionLog],
        tls: EtcdTLS | None = None,
    ) -> None:
        self.endpoints = list(endpoints)
        self.username = username
        self._password = password
        self.tls = tls
        #: Endpoints that answered once: their later failures are outages, not misconfiguration.
        self._reached: set[Endpoint] = set()
        self.connect_timeout = connect_timeout
        self._log = log
        self._index = 0
        self._current: Channel | None = None
        self._channels: set[Channel] = set()
        self._connecting = anyio.Lock()
        self._auth_disabled = False
        self.closed = False
        #: Monotonic time of the last request that etcd answered, with a result or an error (-inf: none yet).
        self.answered_at = float("-inf")
        self._transport_checked = False
        #: Between this connection and etcd: every request and watch message goes through it (None: nothing).
        self.interceptor: Interceptor | None = None
        #: The turns of the requests and watches given a lane.
        self.admission = Admission()

    def __repr__(self) -> str:
        return f"<Connection {self.describe()}>"

    @property
    def log(self) -> ElectionLog:
        return self._log()

    @property
    def ever_answered(self) -> bool:
        """True once any etcd member has answered any request of this connection (with a result or an error)."""
        return self.answered_at > float("-inf")

    def transport_warning(self) -> str | None:
        """Why this connection is exposed on the network, or None.

        Plain HTTP to an endpoint that is not loopback is; TLS always
        verifies the server here, so TLS never is.
        """
        if self.tls is not None:
            return None
        remote = [e for e in self.endpoints if not is_loopback(e.host)]
        if not remote:
            return None
        return transport_warning(
            "etcd at " + ", ".join(str(e) for e in remote),
            encrypted=False,
            verified=False,
            fix="use https:// endpoints, with ca_file unless the system CAs sign etcd's certificate",
        )

    def warn_transport(self) -> None:
        """Log :meth:`transport_warning` as a WARNING, once per connection (so once per elector)."""
        if self._transport_checked:
            return
        self._transport_checked = True
        warning = self.transport_warning()
        if warning is not None:
            self.log.warning("%s", warning)

    def describe(self) -> str:
        if self.tls is None:
            return ",".join(str(e) for e in self.endpoints)
        return ",".join(f"https://{e}" for e in self.endpoints) + f" over {self.tls.describe()}"

    # --- errors (the :class:`~aioelect.core._backend.ErrorTable` shape) ---------------------

    def _sorted(self, exc: BaseException, what: str) -> BaseException:
        found = classify(exc, what, self.endpoints[self._index], self.username)
        return exc if found is None else found

    def permanent(self, exc: BaseException) -> bool:
        """Whether no retry can fix ``exc``: etcd's refusal (:func:`classify`), or an error that is not etcd's."""
        return not isinstance(self._sorted(exc, "the request"), Transient)

    def failure(self, exc: Exception, what: str) -> ElectionError:
        """What to raise for ``exc`` caught while doing ``what``: etcd's refusal as it is, else
        :class:`~aioelect.BackendUnavailable` (saying when a write may have been applied)."""
        found = self._sorted(exc, what)
        if isinstance(found, ElectionError):
            return found
        if not isinstance(found, Transient):
            return PermanentBackendError(f"the etcd client failed {what}: {found!r}")
        may = " (the write may have been applied)" if found.timed_out else ""
        return BackendUnavailable(f"etcd at {self.describe()} is unreachable: {found}{may}")

    # --- channels ------------------------------------------------------------------

    async def _current_channel(self) -> Channel:
        current = self._current
        if current is not None and not current.retired.is_set() and not self.closed:
            return current  # the common case, without taking the lock (a checkpoint per request)
        async with self._connecting:
            if self.closed:
                raise ElectorClosed("the elector is closed")
            current = self._current
            if current is not None and not current.retired.is_set():
                return current
            endpoint = self.endpoints[self._index]
            self.warn_transport()
            channel = await self._open(endpoint)
            self._current = channel
            self._channels.add(channel)
            return channel

    async def _open(self, endpoint: Endpoint) -> Channel:
        auth = None
        if self.username is not None and self._password is not None and not self._auth_disabled:
            auth = (self.username, self._password)
        channel = Channel(endpoint, self.tls.credentials() if self.tls is not None else None)
        try:
            if auth is not None:
                with anyio.fail_after(self.connect_timeout + 0.5):
                    await settle(channel.authenticate(*auth, self.connect_timeout))
        except BaseException as exc:
            await channel.close(self.log)
            if not isinstance(exc, Exception):
                raise
            error = rpc_error(exc)
            if error is not None and "authentication is not enabled" in str(error.details()):
                # As etcd's Go client does: credentials for a server without auth are not an error.
                self.log.debug("etcd at %s has authentication disabled; connecting without credentials", endpoint)
                self._auth_disabled = True
                return await self._open(endpoint)
            failure = classify(exc, "authentication" if auth is not None else "connect", endpoint, self.username)
            if failure is None:
                raise
            if isinstance(failure, ElectionError):
                self.answered_at = monotonic()  # etcd refused the credentials: it answered
            failure = await self._explain(failure, endpoint)
            if isinstance(failure, Transient) and failure.rotate:
                self._rotate()
            raise failure from None
        if auth is not None:
            self._reached.add(endpoint)
            self.answered_at = monotonic()
        self.log.debug("connected to etcd at %s", endpoint)
        return channel

    async def _explain(self, failure: Exception, endpoint: Endpoint) -> Exception:
        """``failure``, or :class:`ElectionError` if :func:`diagnose_tls` finds that it is permanent."""
        if not isinstance(failure, Transient) or not failure.handshake or endpoint in self._reached:
            return failure
        step = min(self.connect_timeout, 2.0)
        verdict: str | None = None
        with anyio.move_on_after(3 * step + 0.5):
            verdict = await anyio.to_thread.run_sync(diagnose_tls, endpoint, self.tls, step, abandon_on_cancel=True)
        if verdict is None:
            return failure
        self.log.debug("%s (gRPC said: %s)", verdict, failure)
        return PermanentBackendError(verdict)

    def _rotate(self) -> None:
        self._index = (self._index + 1) % len(self.endpoints)

    def fail(self, channel: Channel, failure: Transient) -> None:
        """Retire ``channel`` after ``failure`` so that the next request goes to the next endpoint."""
        if not failure.rotate or channel is not self._current or channel.retired.is_set():
            return
        channel.retired.set()
        self._current = None
        self._rotate()
        self.log.debug("etcd endpoint %s failed (%s); next: %s", channel.endpoint, failure, self.endpoints[self._index])

    def failed(self, exc: Exception, what: str, channel: Channel) -> Exception:
        """The exception to raise for ``exc`` (see :func:`classify`); retires ``channel`` if it is to blame."""
        failure = classify(exc, what, channel.endpoint, self.username)
        if failure is None:
            return exc
        if isinstance(failure, Transient):
            self.fail(channel, failure)
        elif failure is not exc:
            self.answered_at = monotonic()  # a refusal that etcd itself gave (permission, credentials)
        return failure

    @contextlib.asynccontextmanager
    async def channel(self) -> AsyncIterator[Channel]:
        """The current channel, kept open while the block runs."""
        channel = await self._current_channel()
        channel.users += 1
        try:
            yield channel
        finally:
            channel.users -= 1
            if channel.retired.is_set() and channel.users == 0:
                await self._close_channel(channel)

    async def _close_channel(self, channel: Channel) -> None:
        self._channels.discard(channel)
        if self._current is channel:
            self._current = None
        await channel.close(self.log)

    async def aclose(self) -> None:
        """Close every channel; watches end with :class:`Retired`, later requests raise ElectionError."""
        self.closed = True
        self._current = None
        channels = list(self._channels)
        for channel in channels:
            channel.retired.set()
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(DRAIN_TIMEOUT):
                while any(c.users for c in channels):  # noqa: ASYNC110 - a few short polls while requests end
                    await anyio.sleep(0.01)
            for channel in channels:
                await self._close_channel(channel)

    # --- requests ------------------------------------------------------------------

    async def call(
        self,
        what: str,
        request: Callable[[Channel], Awaitable[T]] | SelfBounded[T],
        *,
        timeout: float,  # noqa: ASYNC109 - a per-attempt bound, not the caller's deadline
        attempts: int | None = None,
        lane: Lane | None = None,
    ) -> T:
        """Run ``request`` on the current channel, at most ``timeout`` seconds per attempt.

        On a transient failure the next endpoint is tried, each at most once
        (``attempts`` bounds it further); the last failure is raised as
        :class:`Transient`. Permanent failures raise :class:`ElectionError`.
        A :class:`SelfBounded` request is awaited as it is: it needs neither
        a :func:`settle` task nor a cancel scope. With a ``lane``, the
        attempts wait for their turn in :attr:`admission` first.
        """
        async with self.admission.turn(lane):
            return await self._attempts(what, request, timeout, attempts)

    async def _attempts(
        self,
        what: str,
        request: Callable[[Channel], Awaitable[T]] | SelfBounded[T],
        timeout: float,  # noqa: ASYNC109 - a per-attempt bound, not the caller's deadline
        attempts: int | None,
    ) -> T:
        tries = min(attempts or len(self.endpoints), len(self.endpoints))
        last: Transient | None = None
        attempt = 0
        while attempt < tries:
            attempt += 1
            try:
                async with self.channel() as channel:
                    try:
                        if isinstance(request, SelfBounded):
                            reply = await self._sent(what, request.run, channel)
                        else:
                            with anyio.fail_after(timeout):
                                reply = await settle(self._sent(what, request, channel))
                    except Exception as exc:
                        failure = await self._explain(self.failed(exc, what, channel), channel.endpoint)
                        if failure is exc:
                            raise
                        raise failure from None
                    self._reached.add(channel.endpoint)
                    self.answered_at = monotonic()
                    return reply
            except Transient as exc:
                if exc.answered:
                    self.answered_at = monotonic()
                if exc.reauth and not (last is not None and last.reauth):
                    tries += 1  # once more, on a channel that authenticates afresh
                last = exc
                if not exc.rotate:
                    break
        assert last is not None
        raise last

    def _sent(self, what: str, request: Callable[[Channel], Awaitable[T]], channel: Channel) -> Awaitable[T]:
        """``request(channel)``, through the :attr:`interceptor` if there is one."""
        interceptor = self.interceptor
        if interceptor is None:
            return request(channel)
        return interceptor.exchange(what, lambda: request(channel))

    @contextlib.asynccontextmanager
    async def watch(
        self,
        key: bytes,
        *,
        start_revision: int,
        range_end: bytes | None = None,
        no_put: bool = False,
        no_delete: bool = False,
        lane: Lane | None = None,
    ) -> AsyncIterator[WatchStream]:
        """An etcd watch on its own stream, always cancelled when the block ends.

        The watch is created (etcd acknowledged it) before the block runs, or
        :class:`Transient` / :class:`Compacted` / :class:`ElectionError` is raised.
        With a ``lane``, its creation waits for a turn in :attr:`admission`
        first (:class:`Retired` if the channel was replaced meanwhile).
        """
        request = create_request(
            key, start_revision=start_revision, range_end=range_end, no_put=no_put, no_delete=no_delete
        )
        async with self.channel() as channel:
            call = None
            try:
                async with self.admission.turn(lane):
                    if channel.retired.is_set():
                        raise Retired()  # replaced while we waited for our turn
                    call = channel.watch.Watch(metadata=channel.metadata)
                    created = await self._created(call, request, channel)
                stream = WatchStream(
                    call, channel, self.failed, self.fail, int(created.header.revision), self.interceptor
                )
                try:
                    yield stream
                finally:
                    stream.close()
            finally:
                if call is not None:
                    call.cancel()

    async def _created(self, call: Any, request: Any, channel: Channel) -> Any:
        """Send the watch's create ``request`` on ``call``; return etcd's acknowledgement (bounded)."""
        try:
            with anyio.fail_after(self.connect_timeout):
                await settle(call.write(request))
                created = await settle(self._sent("watch created", lambda _: call.read(), channel))
        except Exception as exc:
            failure = await self._explain(self.failed(exc, "watch", channel), channel.endpoint)
            if failure is exc:
                raise
            raise failure from None
        if created is not grpc.aio.EOF:
            self.answered_at = monotonic()
        created = check_response(created, channel, "watch", self.fail)
        if not created.created:
            raise Transient(f"etcd at {channel.endpoint} did not acknowledge the watch")
        return created
