"""A session: one lease kept alive in the background, like etcd's Go ``concurrency.Session``.

Every session of a connection renews its lease on the connection's shared
keep-alive stream (:mod:`._keepalive`), not on a stream of its own.

Guarantees (detailed on :class:`Session`): a session ends as soon as its
lease may have expired; a closed session runs nothing and has its lease
revoked (or, if etcd cannot be reached, left to expire); a grant
interrupted before its reply leaves no lease behind.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable

import anyio
from aetcd import rpc

from ...core._backend import Backoff, Confirm, monotonic
from ...core._errors import ElectionError, LossKind, PermanentBackendError
from ...core._log import ElectionLog
from ...core._tasks import TaskSet
from ._connection import Connection, SelfBounded
from ._failures import SessionEnded, Transient, answered
from ._keepalive import keepalives
from ._options import EtcdSettings, grant_problem

__all__ = ["Session", "connect"]


class Session:
    """A lease kept alive in the background, like etcd's Go ``concurrency.Session``.

    Guarantees:

    * the lease lives at least until ``confirmed_at + ttl``: ``confirmed_at``
      is the monotonic time at which the last grant or keep-alive that etcd
      acknowledged was *sent*;
    * ``done`` is set, with ``reason``, as soon as the lease may be gone: etcd
      reports it expired or revoked, or no keep-alive succeeded for ``ttl``
      seconds;
    * every callable in ``listeners`` (one per leadership held on the
      session, added with :meth:`follow`) is called with the send time of
      every acknowledged keep-alive, and every one in ``failure_listeners``
      with why a keep-alive that is retried failed;
    * keep-alives go out ``interval`` after the last acknowledged one was
      sent, ``lead_interval`` while a leadership is held on the session (from
      the moment :meth:`follow` is called): a leader's last confirmation is
      never older than ``lead_interval`` when its event loop blocks;
    * after :meth:`close` nothing of the session runs and its lease is revoked
      (or, if etcd cannot be reached, expires by itself).
    """

    def __init__(
        self,
        conn: Connection,
        lease_id: int,
        ttl: int,
        *,
        confirmed_at: float,
        interval: float,
        lead_interval: float | None = None,
        keepalive_timeout: float,
        request_timeout: float,
    ) -> None:
        self.conn = conn
        self.lease_id = lease_id
        self.ttl = ttl
        self.confirmed_at = confirmed_at
        self.interval = interval
        self.lead_interval = interval if lead_interval is None else lead_interval
        self.keepalive_timeout = keepalive_timeout
        self.request_timeout = request_timeout
        self.done = anyio.Event()
        self.reason: str | None = None
        #: What kind of loss the end of this session is for a leadership on it (set with ``reason``).
        self.kind = LossKind.CONNECTION_LOST
        self.listeners: set[Confirm] = set()
        #: Told of each keep-alive that failed and is retried (one per leadership held on the session).
        self.failure_listeners: set[Callable[[str], None]] = set()
        #: What the keep-alive loop sleeps on: woken early when a leadership starts, to take up its cadence at once.
        self._sleep: asyncio.Future[None] | None = None
        #: The keep-alive loop: owned by the session, stopped and awaited by stop().
        self._tasks = TaskSet()
        self._closed = False

    def __repr__(self) -> str:
        return f"<Session lease={self.lease_id:x} ttl={self.ttl}s {'ended' if self.done.is_set() else 'alive'}>"

    @classmethod
    async def grant(
        cls,
        conn: Connection,
        ttl: int,
        *,
        interval: float,
        lead_interval: float | None = None,
        keepalive_timeout: float,
        request_timeout: float,
    ) -> Session:
        """Grant a lease and start keeping it alive.

        The lease ID is chosen here, so that a grant interrupted before its
        reply arrives can still be revoked: nothing is left behind.

        The lease must live at least the ``ttl`` asked: the keep-alive
        interval, the renew deadline and the session's own end are computed
        from it. A longer grant (etcd's minimum TTL) only makes a crashed
        leader's key outlive it longer and is used as asked. A shorter grant
        would let the lease expire while a leader still counts on it, so it
        is refused: the lease is revoked and :class:`ElectionError` raised
        (a permanent error: the same server grants the same again). Adjusting
        the timings to the grant instead would silently weaken what the
        settings promise.
        """
        lease_id = secrets.randbelow(2**62) + 1
        sent = monotonic()
        try:
            reply = await conn.call(
                "lease grant",
                lambda ch: ch.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl, ID=lease_id), metadata=ch.metadata),
                timeout=request_timeout,
            )
        except BaseException as exc:
            if not isinstance(exc, Exception) or (isinstance(exc, Transient) and exc.timed_out):
                # The grant may have been applied without our hearing of it. Briefly: if etcd does not
                # answer, the lease (without keys) expires by itself.
                bound = min(request_timeout, 1.0)
                with anyio.CancelScope(shield=True), anyio.move_on_after(bound):
                    await _revoke(conn, lease_id, bound)
            raise
        if reply.error:
            raise Transient(f"etcd refused the lease: {reply.error}", answered(str(reply.error)))
        problem = grant_problem(ttl, int(reply.TTL))
        if problem is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(request_timeout):
                await _revoke(conn, lease_id, request_timeout)
            raise PermanentBackendError(problem)
        if ttl != reply.TTL:
            conn.log.debug("etcd granted a %ss lease for the %ss asked (its minimum TTL)", reply.TTL, ttl)
        session = cls(
            conn,
            lease_id,
            ttl,
            confirmed_at=sent,
            interval=interval,
            lead_interval=lead_interval,
            keepalive_timeout=keepalive_timeout,
            request_timeout=request_timeout,
        )
        session._tasks.start(
            session._keep_alive(), name=f"aioelect-etcd-lease-{lease_id:x}", on_done=session._keeper_done
        )
        return session

    @classmethod
    async def start(cls, conn: Connection, settings: EtcdSettings) -> Session:
        """:meth:`grant` with the lease and timings of ``settings``."""
        return await cls.grant(
            conn,
            settings.ttl,
            interval=settings.keepalive_interval,
            lead_interval=settings.lead_interval,
            keepalive_timeout=settings.keepalive_timeout,
            request_timeout=settings.timing.connect_timeout,
        )

    def _keeper_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.conn.log.error("keep-alive of lease %x failed", self.lease_id, exc_info=task.exception())
            self._end(f"keep-alive failed: {task.exception()!r}", LossKind.CONNECTION_LOST)

    def expire(self, reason: str) -> None:
        """End the session because etcd says its lease is gone."""
        self._end(reason, LossKind.EXPIRED)

    def _end(self, reason: str, kind: LossKind) -> None:
        if self.reason is None:
            self.reason = reason
            self.kind = kind
            self.conn.log.debug("session %x ended: %s", self.lease_id, reason)
        self.done.set()

    def follow(self, confirm: Confirm) -> None:
        """Add a leadership's ``confirm`` to :attr:`listeners`; keep-alives go out every ``lead_interval`` from now."""
        self.listeners.add(confirm)
        if self._sleep is not None:
            _wake(self._sleep)

    @property
    def cadence(self) -> float:
        """Seconds from one acknowledged keep-alive's send to the next send: shorter while a leadership is held."""
        return self.lead_interval if self.listeners else self.interval

    async def _until(self, due: float | None) -> None:
        """Sleep until ``due`` (None: ``cadence`` after the last acknowledged keep-alive), re-reading the cadence
        when a leadership starts."""
        # A future and a timer, as asyncio.sleep is: every waiting candidate's session sleeps here, so no
        # costlier primitive (an event in a cancel scope costs four times as much).
        loop = asyncio.get_running_loop()
        while (left := (due if due is not None else self.confirmed_at + self.cadence) - monotonic()) > 0:
            sleep = self._sleep = loop.create_future()
            timer = loop.call_later(left, _wake, sleep)
            try:
                await sleep
            finally:
                timer.cancel()
                self._sleep = None

    def _confirmed(self, sent: float) -> None:
        if sent > self.confirmed_at:
            self.confirmed_at = sent
        for confirm in list(self.listeners):
            confirm(sent)

    async def keepalive(self) -> float:
        """Renew the lease once; return when the keep-alive was sent.

        Raises :class:`SessionEnded` if etcd says the lease is gone,
        :class:`Transient` if etcd could not be asked.
        """
        if self.done.is_set():
            raise SessionEnded(self.reason or "session ended")
        sent = monotonic()
        ttl = await self.conn.call(
            "lease keep-alive",
            SelfBounded(lambda ch: keepalives(self.conn, ch).renew(self.lease_id, self.keepalive_timeout)),
            timeout=self.keepalive_timeout,
        )
        if ttl <= 0:
            self._end("etcd reports the lease expired or revoked", LossKind.EXPIRED)
            raise SessionEnded(self.reason or "lease gone")
        self._confirmed(sent)
        return sent

    async def _keep_alive(self) -> None:
        backoff = Backoff(first=min(0.05, self.interval / 4), maximum=self.interval / 2)
        retry_at: float | None = None
        while True:
            await self._until(retry_at)
            left = self.confirmed_at + self.ttl - monotonic()
            if left <= 0:
                self._end(f"no keep-alive succeeded for {self.ttl}s: the lease may have expired", LossKind.EXPIRED)
                return
            try:
                with anyio.fail_after(left):
                    await self.keepalive()
            except SessionEnded:
                return
            except ElectionError as exc:
                self._end(f"keep-alive refused: {exc}", LossKind.RELEASED_BY_SERVER)
                return
            except (Transient, TimeoutError) as exc:
                delay = backoff.next_delay()
                # The first failure of a streak is worth a warning; the retries that follow are not.
                level = logging.WARNING if backoff.attempt == 1 else logging.DEBUG
                self.conn.log.log(
                    level,
                    "keep-alive of lease %x failed (%s); retrying in %.2fs",
                    self.lease_id,
                    str(exc) or "timed out",
                    delay,
                )
                for failed in list(self.failure_listeners):
                    failed(f"keep-alive of lease {self.lease_id:x} failed ({str(exc) or 'timed out'})")
                retry_at = monotonic() + delay
                continue
            backoff.reset()
            retry_at = None

    async def wait_ended(self) -> str:
        """Return the reason once the session has ended."""
        await self.done.wait()
        return self.reason or "session ended"

    async def stop(self) -> None:
        """Stop the keep-alives and wait until they have stopped. Idempotent; never interrupted."""
        self.listeners.clear()
        self.failure_listeners.clear()
        await self._tasks.aclose()
        self._end("session closed", LossKind.CONNECTION_LOST)

    async def close(self) -> None:
        """Stop the keep-alives, then revoke the lease (at most ``request_timeout``). Idempotent.

        Cancellation may cut the revoke short (the lease then expires by
        itself), never the stopping of the keep-alives.
        """
        await self.stop()
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(self.request_timeout):
            await _revoke(self.conn, self.lease_id, self.request_timeout)


def _wake(sleep: asyncio.Future[None]) -> None:
    if not sleep.done():
        sleep.set_result(None)


def connect(settings: EtcdSettings, log: Callable[[], ElectionLog]) -> Connection:
    """The connection ``settings`` describe (nothing connects before the first request)."""
    return Connection(
        settings.endpoints,
        username=settings.username,
        password=settings.password,
        connect_timeout=settings.timing.connect_timeout,
        log=log,
        tls=settings.tls,
    )


async def _revoke(conn: Connection, lease_id: int, timeout: float) -> None:  # noqa: ASYNC109
    """Revoke a lease, best effort: an unknown lease is already gone, an unreachable etcd expires it."""
    try:
        await conn.call(
            "lease revoke",
            lambda ch: ch.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease_id), metadata=ch.metadata),
            timeout=timeout,
        )
    except (Transient, ElectionError) as exc:
        conn.log.debug("revoking lease %x failed (%s); it expires by itself", lease_id, exc)
