"""One session shared by several electors of a process: Go's ``concurrency.Session`` shared by ``Election`` s.

Guarantees (detailed on :class:`EtcdSession`): every elector on the session
campaigns under one lease renewed by one keep-alive per ``ttl / 3``, over
one connection; an elector's release or close never revokes that lease; the
session's close closes its electors first, then revokes the lease. What it
gives up is independence: the lease's end ends the leadership of every
elector on it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ...core._backend import SharedSession
from ...core._config import check_options
from ...core._errors import BackendUnavailable
from ...core._log import ElectionLog
from ._failures import Transient
from ._options import EtcdOptions, EtcdSessionOptions, EtcdSettings
from ._session import Session, connect

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

__all__ = ["EtcdSession"]

#: The name the session's own log lines carry (its electors log under their election's name).
_LOG_NAME = "<shared session>"


class EtcdSession(SharedSession):
    """One etcd lease, kept alive by one keep-alive stream, shared by several :class:`~aioelect.EtcdElector` s.

    Opt-in, as Go's ``concurrency.Session`` shared by several ``Election`` s::

        async with aioelect.EtcdSession("127.0.0.1:2379", ttl=5) as session:
            jobs = aioelect.EtcdElector(session=session, name="jobs")
            mail = aioelect.EtcdElector(session=session, name="mail")

    The options are those of :class:`~aioelect.EtcdElector` that say how to
    reach etcd and how long the lease lives (``ttl``, ``renew_deadline``,
    ``connect_timeout``, ``username``, ``password``, ``ca_file``,
    ``cert_file``, ``key_file``), validated here; an elector on the session
    takes only ``name`` (and ``identity``, ``stop_timeout``).

    Guarantees:

    * one lease and one keep-alive every ``ttl / 3`` for the whole session,
      however many electors use it, and one connection for all their
      requests and watches;
    * on that connection at most 32 campaign requests and watch creations
      of its electors are in flight at once, the others queued (a held
      leadership's first); the keep-alive, grants, revokes, resigns and
      withdrawals never queue, so a cold start of many campaigns does not
      delay the keep-alive that confirms every leadership;
    * **fate sharing**, what the session gives up: when the lease expires or
      is revoked, every elector on the session loses its leadership (each
      sees its key go) and its campaign starts again under a new shared
      lease, granted by the first campaign that needs one. A resign or
      withdrawal that fails ends the lease too, on purpose: the key must
      not outlive its release. Logged at WARNING when the session is entered
      and each time the lease is ended on purpose;
    * an elector's release deletes its own key only, and its ``aclose()``
      leaves the lease to the others;
    * at most one elector per election ``name`` on one session (they would
      share a key): a second one is a ValueError;
    * leaving the ``async with`` (or :meth:`aclose`) closes every elector
      still open on the session first (their leaderships released, their
      campaigns cancelled), then revokes the lease and closes the
      connection: no lease, key or task is left behind. Idempotent, never
      interrupted by cancellation, bounded;
    * entering grants the first lease: :class:`~aioelect.BackendUnavailable`
      if etcd cannot be reached, :class:`~aioelect.ElectionError` for
      refused credentials or TLS; electors campaign only on an entered,
      unclosed session (else :class:`~aioelect.ElectionError`).
    """

    who = "EtcdSession"

    def __init__(self, endpoints: str | Sequence[str], **options: Unpack[EtcdSessionOptions]) -> None:
        super().__init__()
        check_options("EtcdSession", options, EtcdSessionOptions)
        # No election of its own: the name only passes validation.
        named = EtcdOptions(name="shared-session", degrade_to_local=False, **options)
        self.settings = EtcdSettings.parse(endpoints, named, who="EtcdSession")
        self.log = ElectionLog("etcd", _LOG_NAME, "-")
        self.conn = connect(self.settings, lambda: self.log)
        self._session: Session | None = None
        self._granting = anyio.Lock()

    def __repr__(self) -> str:
        lease = "none" if self.lease_id is None else f"{self.lease_id:x}"
        state = "closed" if self._closed else "open"
        return f"<EtcdSession {self.conn.describe()} lease={lease} electors={len(self._members)} {state}>"

    @property
    def lease_id(self) -> int | None:
        """The current shared lease's ID, or None while there is none alive."""
        session = self._session
        return None if session is None or session.done.is_set() else session.lease_id

    # --- electors ------------------------------------------------------------------

    def join(self, name: str, backend: object, close: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Register the elector of election ``name`` (ValueError if the session has one, or is closed)."""
        if self._closed:
            raise ValueError("this EtcdSession is closed: make electors on an open one")
        if name in self._members:
            raise ValueError(
                f"an elector on this EtcdSession already campaigns on {name!r}: electors of one session share "
                "a lease, hence a key per election; close it first, or use another session"
            )
        self._members[name] = (backend, close)

    # --- the lease -----------------------------------------------------------------

    async def current(self) -> Session:
        """The live shared session; a new lease if the last one ended (:class:`Transient` if etcd fails)."""
        self._check_open()
        session = self._session
        if session is not None and not session.done.is_set():
            return session
        async with self._granting:
            session = self._session
            if session is not None and not session.done.is_set():
                return session
            if session is not None:
                self.log.info("shared lease %x ended (%s); granting a new one", session.lease_id, session.reason)
                await self._revoke(session)
            session = await Session.start(self.conn, self.settings)
            self._session = session
            self.log.debug("shared lease %x granted", session.lease_id)
            return session

    async def end(self, session: Session, why: str, *, revoke: bool = True) -> None:
        """End ``session``'s lease on purpose: every elector on it loses its leadership. Never interrupted.

        Its keep-alives stop at once (it expires within ``ttl`` at the latest);
        with ``revoke``, the lease is revoked too (bounded). The next campaign
        on the session grants a new lease.
        """
        if session.done.is_set():
            return  # ended already: the next campaign, or aclose(), revokes what is left
        self.log.warning(
            "ending the shared lease %x (%s): every elector on this session (%d) loses its leadership or campaign",
            session.lease_id,
            why,
            len(self._members),
        )
        if revoke:
            await self._revoke(session)
        else:
            await session.stop()

    async def _revoke(self, session: Session) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.settings.release_timeout):
            await session.close()
        await session.stop()  # already stopped unless the bound cut close() short

    # --- lifetime ------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._enter("etcd session share one lease", "it expires or is revoked")
        try:
            await self.current()
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, Transient):
                raise BackendUnavailable(f"cannot start the shared etcd session ({exc})") from None
            raise
        return self

    async def _close_own(self) -> None:
        """Revoke the lease, then close the connection."""
        if self._session is not None:
            await self._revoke(self._session)
            self._session = None
        await self.conn.aclose()
