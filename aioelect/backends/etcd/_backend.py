"""The etcd backend: campaigns on the :class:`~._election.Election` with sessions; the held leadership is :mod:`._hold`.

Beyond Go's ``Campaign``: the wait ends if our own session expires (Go's
would wait on for a predecessor while our key is already gone), after which
we campaign again with a new session; and before a campaign returns, our
key is checked to still exist under our lease (by a read, or for the next
in line by the revisions of the watch that saw its predecessor go).

On a shared :class:`~._shared.EtcdSession`, every elector of the session
campaigns under its one lease; a release or close never revokes it, and a
failed resign or withdrawal ends it for all (its key must not outlive it).

As Go's ``Session``, one session (lease) serves the successive campaigns of
an elector: a release deletes our key only, and the lease is revoked when
the elector closes, or at once when the session cannot be trusted any more
(a lost leadership, a failed resign or campaign, keep-alives late).

Guarantees: a campaign that does not return a leadership (cancellation
included) leaves no key and no lease behind; a leadership is dated from
the last acknowledged keep-alive (docs/concepts.md, "When a leadership is
dated from"), and a campaign returns it only with at least one keep-alive
interval left before its renew deadline (the lease is renewed first if it
was not confirmed that recently: never a leadership lost as it is returned);
local leadership without etcd happens only when ``degrade_to_local=True``
and etcd has never answered this elector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio
from aetcd import rpc

from ...core._backend import Backoff, Hold, StateStore, monotonic
from ...core._config import check_options, validate_name
from ...core._errors import BackendUnavailable, ElectionError
from ...core._tasks import first_of
from ._candidacy import Candidacy, Move, Tracker
from ._degraded import DegradedHold
from ._election import RANGE_WAIT_MAX, Election, KeyLost, Turn
from ._failures import SessionEnded, Transient
from ._hold import EtcdHold
from ._leases import LeaseMode, OwnLeases, SharedLease
from ._options import EtcdOptions, EtcdSettings, _EtcdElectionName
from ._session import Session, connect
from ._shared import EtcdSession
from ._state import EtcdStateStore

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["EtcdBackend", "EtcdHold"]


class EtcdBackend(Election):
    """Elections on an etcd cluster, built from its endpoints and :class:`EtcdOptions`.

    The constructor validates every option (ValueError naming it, never the
    password) and reads the TLS files; it connects to nothing.
    """

    kind = "etcd"

    def __init__(
        self,
        endpoints: str | Sequence[str] | None = None,
        *,
        session: EtcdSession | None = None,
        **options: Unpack[EtcdOptions],
    ) -> None:
        if session is None:
            if endpoints is None:
                raise TypeError("EtcdElector() needs endpoints, or session= for a shared EtcdSession")
            settings = EtcdSettings.parse(endpoints, options)
            conn = connect(settings, lambda: self.log)
        else:
            if endpoints is not None:
                raise TypeError("EtcdElector(session=...) takes its endpoints from the session: pass one or the other")
            check_options("EtcdElector", options, _EtcdElectionName)  # the rest are the session's options
            settings = replace(session.settings, name=validate_name(options["name"], max_length=1024))
            conn = session.conn
        super().__init__(settings.name, conn, request_timeout=settings.timing.connect_timeout)
        self.settings = settings
        #: Whose lease this elector campaigns under: its own, or a shared session's.
        self.leases: LeaseMode = (
            OwnLeases(conn, settings)
            if session is None
            else SharedLease(session, lambda: session.leave(settings.name, self))
        )
        #: The validated timing, as every server backend keeps it: ``lease`` is the ttl.
        self.timing = settings.timing
        self.ttl = settings.ttl
        self.keepalive_interval = settings.keepalive_interval
        self._renew_deadline = settings.timing.renew_deadline
        self.session_keepalive_timeout = settings.keepalive_timeout
        self.connect_timeout = settings.timing.connect_timeout
        self.release_timeout = settings.release_timeout
        self.degrade_to_local = settings.degrade_to_local
        self.degraded: DegradedHold | None = None
        #: Where the current campaign stands (its steps: CANDIDACY_TRANSITIONS).
        self.candidacy = Tracker()

    @property
    def renew_deadline(self) -> float:
        return self._renew_deadline

    @property
    def margin(self) -> float:
        return self.settings.margin

    def describe_timing(self) -> str:
        degrade = (
            "leads locally WITHOUT mutual exclusion while etcd has never answered (degrade_to_local=True)"
            if self.degrade_to_local
            else "waits for etcd if it cannot be reached"
        )
        return (
            f"ttl={self.ttl}s{self.leases.describe} keep-alive every {self.keepalive_interval:.3g}s "
            f"(every {self.settings.lead_interval:.3g}s while leading) "
            f"(timeout {self.session_keepalive_timeout:.3g}s) renew_deadline={self._renew_deadline:.3g}s "
            f"connect_timeout={self.connect_timeout:g}s endpoints={self.conn.describe()}: "
            f"a resigning leader is replaced at once, a crashed or cut-off one after about {self.ttl}s "
            f"(its lease expiring); a leader that cannot renew fences itself after {self._renew_deadline:.3g}s, "
            f"{self.margin:.3g}s before its lease can expire; {degrade}"
        )

    # --- campaign ------------------------------------------------------------------

    def keeps(self, session: Session, *, lost: bool) -> bool:
        """After a successful resign: whether ``session`` serves the next campaign (else its lease is revoked)."""
        return self.leases.keeps(session, lost=lost)

    async def end_session(self, session: Session, why: str) -> None:
        """Revoke ``session``'s lease; the caller bounds it (then calls :meth:`forget`)."""
        await self.leases.end(session, why)

    async def forget(self, session: Session, why: str) -> None:
        """Stop ``session``'s keep-alives and forget it, after :meth:`end_session` or instead of it."""
        await self.leases.forget(session, why)

    async def campaign(self, identity: str) -> Hold:
        self.candidacy.begin()
        try:
            return await self._campaign(identity)
        except BaseException:
            self.candidacy.move(Move.GIVE_UP)
            raise
        finally:
            self.sight.end()

    async def _campaign(self, identity: str) -> Hold:
        value = identity.encode()
        backoff = Backoff(first=0.1, maximum=2.0)
        while True:
            try:
                session = await self.leases.live()
            except Transient as exc:
                # Only an etcd that never answered this elector: after any contact, another
                # candidate may lead on etcd, and leading locally would be a second leader.
                if self.degrade_to_local and not self.conn.ever_answered:
                    self.candidacy.move(Move.NEVER_ANSWERED)
                    return self._degrade(identity, exc)
                delay = backoff.next_delay()
                self.report_error(f"cannot start an etcd session ({exc})", delay)
                await anyio.sleep(delay)
                continue
            self.candidacy.move(Move.SESSION)
            try:
                return await self._campaign_in(session, value, backoff)
            except SessionEnded as exc:
                self.candidacy.move(Move.SESSION_ENDED)
                self.log.info("session ended while campaigning (%s); campaigning again with a new session", exc)

    async def try_campaign(self, identity: str) -> Hold | None:
        """Our key under a lease; if another key is first, the key and its lease are withdrawn at once: None.

        Never degrades to local leadership: an etcd that cannot be reached is
        :class:`~aioelect.BackendUnavailable`.
        """
        value = identity.encode()
        self.candidacy.begin()
        try:
            session = await self.leases.live()
        except Transient as exc:
            self.candidacy.move(Move.GIVE_UP)
            raise BackendUnavailable(f"cannot start an etcd session ({exc})") from None
        except BaseException:
            self.candidacy.move(Move.GIVE_UP)
            raise
        self.candidacy.move(Move.SESSION)
        key = self.prefix + f"{session.lease_id:x}".encode()
        try:
            try:
                revision, predecessor, read_at = await self._put_candidate(session, key, value)
            except (Transient, KeyLost, SessionEnded) as exc:
                raise BackendUnavailable(f"etcd campaign interrupted ({exc or type(exc).__name__})") from None
            if predecessor is not None:
                self.candidacy.move(Move.PREDECESSOR)
                return None
            self.candidacy.move(Move.FIRST)
            hold = EtcdHold(self, session, key, revision, acquired_at=session.confirmed_at, watch_from=read_at + 1)
            self.candidacy.move(Move.DATED)
            return hold
        finally:
            self.sight.end()
            if self.candidacy.state is not Candidacy.LEADING:
                try:
                    await self._withdraw(session, key)
                finally:
                    self.candidacy.move(Move.GIVE_UP)

    async def _campaign_in(self, session: Session, value: bytes, backoff: Backoff) -> Hold:
        """Campaign with ``session`` until we lead; raise SessionEnded if it ends first.

        Anything but success (cancellation included) deletes our key and ends
        the session (revokes its lease). Never degrades: a session means etcd
        answered.
        """
        key = self.prefix + f"{session.lease_id:x}".encode()
        try:
            while True:
                try:
                    # The hold first: when both end in one step, it is closed here rather than dropped.
                    which, found = await first_of(lambda: self._try(session, key, value), session.wait_ended)
                except KeyLost:
                    self.candidacy.move(Move.KEY_LOST)
                    self.log.warning("our candidate key was deleted while our lease lives; campaigning again")
                    continue
                except Transient as exc:
                    if exc.lease_gone:
                        session.expire("etcd reports the lease gone")
                        raise SessionEnded(str(exc)) from None
                    self.candidacy.move(Move.RETRY)
                    delay = backoff.next_delay()
                    self.report_error(f"campaign interrupted ({exc})", delay)
                    with anyio.move_on_after(delay):
                        await session.wait_ended()
                    continue
                if which == 1:
                    raise SessionEnded(str(found))
                hold = found
                assert isinstance(hold, EtcdHold)
                try:
                    await self._confirm_fresh(session)
                except BaseException:
                    await hold.abandon()
                    raise
                # Dated from the keep-alive just acknowledged: the lease lives at least ttl past its send.
                hold.acquired_at = session.confirmed_at
                backoff.reset()
                self.candidacy.move(Move.DATED)
                return hold
        finally:
            if self.candidacy.state is not Candidacy.LEADING:
                await self._withdraw(session, key)

    def _stale(self, session: Session) -> bool:
        """Whether a leadership dated from ``session``'s last acknowledged keep-alive would have less than one
        keep-alive interval left before its renew deadline."""
        return monotonic() - session.confirmed_at > self._renew_deadline - self.keepalive_interval

    async def _confirm_fresh(self, session: Session) -> None:
        """Return once ``session``'s lease was confirmed recently enough for a new leadership: not
        :meth:`_stale`, or renewed by a keep-alive sent here (acknowledged within ``keepalive_timeout``, at most
        half the time between the keep-alive interval and the renew deadline).

        A win found while keep-alives were failing over (a member died, the
        cluster elected a raft leader) would otherwise be a leadership past
        its renew deadline, lost as soon as it is returned: the campaign,
        finished, would campaign no more. Here the lease is renewed first,
        retried until etcd acknowledges one; if the session ends meanwhile
        (its lease may have expired, our key with it), :class:`SessionEnded`
        sends the campaign on with a new session.
        """
        backoff = Backoff(first=0.05, maximum=self.keepalive_interval / 2)
        while True:
            if session.done.is_set():
                raise SessionEnded(await session.wait_ended())
            if not self._stale(session):
                return
            self.log.debug(
                "won with lease %x last confirmed %.2fs ago; renewing it before leading",
                session.lease_id,
                monotonic() - session.confirmed_at,
            )
            try:
                await session.keepalive()
            except Transient as exc:
                delay = backoff.next_delay()
                self.log.debug("renewing lease %x failed (%s); retrying in %.2fs", session.lease_id, exc, delay)
                with anyio.move_on_after(delay):
                    await session.wait_ended()
                continue
            # Sent just now and acknowledged within keepalive_timeout (shorter than the renew deadline): fresh
            # enough, whatever the loop's lag, so that a slow etcd cannot keep a won campaign renewing forever.
            if not session.done.is_set():
                return

    async def _try(self, session: Session, key: bytes, value: bytes) -> EtcdHold:
        """Our key put and waited on until it leads: the hold, the campaign moved to WON by the step that proved it
        (FIRST: a read found no older key; HANDED: the watch saw the last older key go while ours stood)."""
        revision, predecessor, read_at = await self._put_candidate(session, key, value)
        self.log.debug("candidate key %s created at revision %d", key.decode(errors="replace"), revision)
        shortcut = True
        while predecessor is not None:
            self.candidacy.move(Move.PREDECESSOR)
            # In a small election, the watch's own revisions tell whether the predecessor's deletion makes us
            # leader, our key standing under our lease; otherwise, or if anything else happened, read.
            small = self.crowd is not None and self.crowd <= RANGE_WAIT_MAX
            ours = (key, revision, session.lease_id) if small else None
            waited = await self._wait_turn(predecessor, read_at, shortcut=shortcut, ours=ours)
            shortcut = waited.turn is not Turn.SKIPPED
            if waited.turn is Turn.LEADING and (won := waited.watch) is not None:
                self.candidacy.move(Move.HANDED)
                return EtcdHold(
                    self, session, key, revision, session.confirmed_at, watch_from=won.revision + 1, watching=won
                )
            self.candidacy.move(Move.MAY_BE_GONE)
            # One read: our key still stands under our lease (it would be gone with the lease), any older key left?
            predecessor, read_at = await self._check(session, key, revision)
        self.candidacy.move(Move.FIRST)
        # The lease lives at least ttl past its last acknowledged keep-alive: leadership is measured from there.
        return EtcdHold(self, session, key, revision, acquired_at=session.confirmed_at, watch_from=read_at + 1)

    async def _withdraw(self, session: Session, key: bytes) -> None:
        """Delete our candidate key and end the session (a shared one only if the delete failed); bounded, never
        interrupted."""
        withdrawn = False
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(self.release_timeout):
                    if not session.done.is_set():
                        try:
                            await self.conn.call(
                                "withdraw",
                                lambda ch: ch.kv.DeleteRange(rpc.DeleteRangeRequest(key=key), metadata=ch.metadata),
                                timeout=self.request_timeout,
                            )
                            withdrawn = True
                        except (Transient, ElectionError) as exc:
                            self.log.debug("deleting our candidate key failed (%s); the lease's end removes it", exc)
                    if not self.leases.kept_after_withdraw(withdrawn):
                        await self.end_session(session, "a candidate key could not be withdrawn")
            finally:
                if not self.leases.kept_after_withdraw(withdrawn):
                    await self.forget(session, "a candidate key could not be withdrawn")

    def _degrade(self, identity: str, exc: Transient) -> Hold:
        self.log.warning(
            "etcd at %s has never answered this elector (%s); degrade_to_local=True, so leading locally WITHOUT "
            "mutual exclusion: every instance that cannot reach etcd may become leader at the same time. This "
            "leadership is lost as soon as etcd answers. Leave degrade_to_local off to wait for etcd instead.",
            self.conn.describe(),
            exc,
        )
        hold = DegradedHold(
            self.conn, identity, interval=self.keepalive_interval, ask=self.first_candidate, on_release=self._undegrade
        )
        self.degraded = hold
        return hold

    def _undegrade(self, hold: DegradedHold) -> None:
        if self.degraded is hold:
            self.degraded = None

    def _new_state_store(self) -> StateStore:
        return EtcdStateStore(self.name, self.conn, self.request_timeout)

    def local_leader(self) -> str | None:
        return self.degraded.identity if self.degraded is not None else None

    async def aclose(self) -> None:
        """Free what the lease mode owns: every lease of our own and the connection, or our place on a shared
        session (its lease and connection are the session's)."""
        await self.leases.aclose()
