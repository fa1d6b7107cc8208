"""The held etcd leadership: watched until our key or our session goes, released by resigning.

Guarantees (detailed on :class:`EtcdHold`): a loss is reported as soon as
our key is deleted (a watch that resynchronises by reading the key whenever
it breaks) or our session ends; a release resigns (deletes our key if it is
still ours), bounded and never interrupted, and revokes the lease unless the
backend keeps the session.
"""

from __future__ import annotations

from typing import Any, Protocol

import anyio
from aetcd import rpc

from ...core._backend import Backoff, Confirm, Hold, Loss
from ...core._errors import ElectionError, LossKind
from ...core._log import ElectionLog
from ...core._tasks import first_of
from ._admission import Lane
from ._connection import Connection
from ._election import DELETE, OpenWatch
from ._failures import Retired, Transient
from ._session import Session

__all__ = ["EtcdHold", "Owner"]


class Owner(Protocol):
    """What a hold needs of its backend (:class:`~._backend.EtcdBackend`)."""

    conn: Connection
    session_keepalive_timeout: float
    release_timeout: float

    @property
    def log(self) -> ElectionLog: ...

    async def get_key(self, key: bytes) -> tuple[Any, int]: ...

    async def resign(self, key: bytes, revision: int) -> None: ...

    def keeps(self, session: Session, *, lost: bool) -> bool: ...

    async def end_session(self, session: Session, why: str) -> None: ...

    async def forget(self, session: Session, why: str) -> None: ...

    def report_retried(self, what: str) -> None: ...


class EtcdHold(Hold):
    """Leadership held as the candidate key with the lowest create revision."""

    def __init__(
        self,
        backend: Owner,
        session: Session,
        key: bytes,
        revision: int,
        acquired_at: float,
        watch_from: int,
        watching: OpenWatch | None = None,
    ) -> None:
        self._backend = backend
        #: The watch our key's deletion comes on, kept open until a new one is needed or the release has resigned:
        #: closing a gRPC stream takes time that a releasing leader's successor would wait for.
        self._watching = watching
        self._session = session
        self.key = key
        self.revision = revision
        self.token = revision
        self.acquired_at = acquired_at
        self._watch_from = watch_from
        self._released = False
        self._lost = False

    async def monitor(self, confirm: Confirm) -> Loss:
        session = self._session
        session.follow(confirm)
        failed = self._backend.report_retried
        session.failure_listeners.add(failed)
        if session.confirmed_at > self.acquired_at:
            confirm(session.confirmed_at)
        try:
            _, loss = await first_of(self._session_ended, self._key_deleted)
            self._lost = True
            assert isinstance(loss, Loss)
            return loss
        finally:
            session.listeners.discard(confirm)
            session.failure_listeners.discard(failed)

    async def _session_ended(self) -> Loss:
        reason = await self._session.wait_ended()
        return Loss(self._session.kind, f"session ended: {reason}")

    async def _key_deleted(self) -> Loss:
        """Return once our key is gone; resynchronise by reading it whenever the watch breaks."""
        b = self._backend
        start = self._watch_from
        backoff = Backoff(first=0.05, maximum=1.0)
        while True:
            try:
                if self._watching is None:
                    self._watching = await OpenWatch.open(
                        b.conn, self.key, start_revision=start, no_put=True, lane=Lane.HOLD
                    )
                stream = self._watching.stream
                backoff.reset()
                while True:
                    response = await stream.next()
                    if any(e.type == DELETE and bytes(e.kv.key) == self.key for e in response.events):
                        return await self._why_deleted()
                    start = max(start, int(response.header.revision) + 1)
            except Transient as exc:
                await self._close_watch()
                b.log.debug("watch on our key interrupted (%s); reading it again", exc)
                if not isinstance(exc, Retired):
                    await anyio.sleep(backoff.next_delay())
            try:
                kv, revision = await b.get_key(self.key)
            except Transient as exc:
                b.log.debug("cannot read our key (%s); the session decides", exc)
                continue
            if kv is None or kv.create_revision != self.revision or kv.lease != self._session.lease_id:
                return await self._why_deleted()
            start = revision + 1

    async def abandon(self) -> None:
        """Close what the hold keeps open, for a campaign that will not return it (its key is withdrawn)."""
        self._released = True
        await self._close_watch()

    async def _close_watch(self) -> None:
        watching, self._watching = self._watching, None
        if watching is not None:
            await watching.close()

    async def _why_deleted(self) -> Loss:
        b = self._backend
        try:
            reply = await b.conn.call(
                "lease time-to-live",
                lambda ch: ch.lease.LeaseTimeToLive(
                    rpc.LeaseTimeToLiveRequest(ID=self._session.lease_id), metadata=ch.metadata
                ),
                timeout=b.session_keepalive_timeout,
                attempts=1,
            )
            if reply.TTL < 0:
                return Loss(LossKind.EXPIRED, "leader key deleted: our lease was revoked or expired")
        except (Transient, ElectionError):
            pass
        return Loss(LossKind.DEPOSED, "leader key deleted (resigned elsewhere or removed by hand)")

    async def release(self) -> None:
        """Resign as election.go does (delete our key if it is still ours); the next candidate leads at once.

        The session is kept for the elector's next campaign only if the resign
        succeeded and the backend keeps it (:meth:`EtcdBackend.keeps`);
        otherwise its lease is revoked too, which removes the key if the resign
        could not. Bounded by ``release_timeout``; never interrupted.
        """
        if self._released:
            return
        self._released = True
        b = self._backend
        session = self._session
        keep = False
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(b.release_timeout):
                    try:
                        await b.resign(self.key, self.revision)
                        keep = b.keeps(session, lost=self._lost)
                    except (Transient, ElectionError) as exc:
                        b.log.debug("resign failed (%s); revoking the lease removes the key", exc)
                    if not keep:
                        await b.end_session(session, "a resign failed")
            finally:
                if not keep:
                    await b.forget(session, "a resign did not finish")
                await self._close_watch()
