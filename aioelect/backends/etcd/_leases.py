"""Whose lease an elector campaigns under: leases of its own, or the one lease of a shared session.

Each mode is an object that knows what it owns and what it may end, so
that the campaign and the hold ask it rather than test which one they have:

* :class:`OwnLeases`: the elector's own sessions, one serving its
  successive campaigns (Go's ``Session``); it revokes them whenever they
  cannot be trusted, and all of them when the elector closes, then closes
  the connection;
* :class:`SharedLease`: the lease of an :class:`~._shared.EtcdSession`
  that many electors use; it never revokes it on a release or a withdrawn
  candidacy, only when a key of ours could outlive the release otherwise
  (which ends the lease for every elector on it), and a closing elector
  only leaves the session.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import anyio

from ...core._backend import monotonic
from ._connection import Connection
from ._options import EtcdSettings
from ._session import Session
from ._shared import EtcdSession

__all__ = ["LeaseMode", "OwnLeases", "SharedLease"]


class LeaseMode(abc.ABC):
    """The sessions one elector campaigns with, and what it may do with them."""

    #: Appended to the elector's timing description.
    describe: str = ""

    @abc.abstractmethod
    async def live(self) -> Session:
        """The session to campaign with now (a new one if the last ended); :class:`Transient` if etcd fails."""

    @abc.abstractmethod
    def keeps(self, session: Session, *, lost: bool) -> bool:
        """After a successful resign: whether ``session`` serves the next campaign (else it is ended)."""

    @abc.abstractmethod
    def kept_after_withdraw(self, withdrawn: bool) -> bool:
        """After a campaign that did not win: whether ``session`` lives on (``withdrawn``: our key was deleted)."""

    @abc.abstractmethod
    async def end(self, session: Session, why: str) -> None:
        """Revoke ``session``'s lease; the caller bounds it (then calls :meth:`forget`)."""

    @abc.abstractmethod
    async def forget(self, session: Session, why: str) -> None:
        """Stop ``session``'s keep-alives and forget it, after :meth:`end` or instead of it. Never interrupted."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """The elector closes: free what this mode owns."""


class OwnLeases(LeaseMode):
    """Sessions of the elector's own: one serves its successive campaigns while it can be trusted."""

    def __init__(self, conn: Connection, settings: EtcdSettings) -> None:
        self._conn = conn
        self._settings = settings
        #: Every session not yet stopped; ``current`` is the one the next campaign uses, if still alive.
        self._sessions: set[Session] = set()
        self.current: Session | None = None

    async def live(self) -> Session:
        session = self.current
        if session is not None and session.done.is_set():
            # Ended between two campaigns (revoked, expired, keep-alives failing): revoke what may be left.
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._settings.release_timeout):
                await session.close()
            await self._drop(session)
            session = None
        if session is None:
            session = await Session.start(self._conn, self._settings)
            self.current = session
            self._sessions.add(session)
        return session

    def _reusable(self, session: Session) -> bool:
        """Current, alive, and renewed within ``renew_deadline``."""
        return (
            session is self.current
            and not session.done.is_set()
            and not self._conn.closed
            and monotonic() - session.confirmed_at < self._settings.timing.renew_deadline
        )

    def keeps(self, session: Session, *, lost: bool) -> bool:
        return not lost and self._reusable(session)

    def kept_after_withdraw(self, withdrawn: bool) -> bool:
        return False  # a campaign that did not win ends its session: the next one starts afresh

    async def end(self, session: Session, why: str) -> None:
        await session.close()

    async def forget(self, session: Session, why: str) -> None:
        await self._drop(session)

    async def _drop(self, session: Session) -> None:
        await session.stop()
        self._sessions.discard(session)
        if self.current is session:
            self.current = None

    async def aclose(self) -> None:
        """Revoke every lease (the kept session's included), then close the connection."""
        for session in list(self._sessions):
            with anyio.move_on_after(self._settings.release_timeout):
                await session.close()
            await self._drop(session)
        self._sessions.clear()
        self.current = None
        await self._conn.aclose()


class SharedLease(LeaseMode):
    """The one lease of an :class:`~._shared.EtcdSession`: not ours to revoke, save to remove a key of ours."""

    describe = " on a shared EtcdSession (its lease's end ends every elector's leadership on it)"

    def __init__(self, shared: EtcdSession, leave: Callable[[], None]) -> None:
        self.shared = shared
        self._leave = leave

    async def live(self) -> Session:
        return await self.shared.current()

    def keeps(self, session: Session, *, lost: bool) -> bool:
        return True  # the next campaign on the session replaces it if its lease has ended

    def kept_after_withdraw(self, withdrawn: bool) -> bool:
        return withdrawn  # a key of ours that may remain must go, with the lease of every elector on it

    async def end(self, session: Session, why: str) -> None:
        await self.shared.end(session, why)

    async def forget(self, session: Session, why: str) -> None:
        # A shared lease that could not be revoked stops its keep-alives, so that it expires within ttl.
        await self.shared.end(session, why, revoke=False)

    async def aclose(self) -> None:
        self._leave()  # the lease and connection are the session's
