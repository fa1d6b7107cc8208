"""Campaign in a background task, run leader work while leading, and say what this instance is.

The integrations share :class:`Campaign`: the web frameworks so that
followers keep serving while the campaign waits, APScheduler so that its
jobs run only under a held leadership, the health server so that probes
can tell a live process from a failed one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import anyio

from .._api import leadership
from ..core._config import redact_dsn
from ..core._elector import Elector, Leadership
from ..core._errors import BackendUnavailable, ElectionError, LeadershipLost, UsageError
from ..core._tasks import TaskSet, consume

__all__ = ["Campaign", "LeaderWork", "Role", "Status"]

log = logging.getLogger("aioelect.integrations")

Role = Literal["leader", "follower", "stopped", "failed"]

#: Leader work: runs while this instance leads, is cancelled when the leadership ends.
LeaderWork = Callable[[Leadership], Awaitable[object]]


@dataclass(frozen=True)
class Status:
    """What one instance knows of its election, as the status endpoints show it.

    ``role`` is ``leader`` while this instance holds a leadership that is
    :attr:`~aioelect.Leadership.held`, ``follower`` while it campaigns,
    ``stopped`` before :meth:`Campaign.start` and after :meth:`Campaign.stop`,
    ``failed`` once the campaign ended on a permanent error (``error`` says
    which). ``leader`` is the current leader's identity as last seen (None:
    nobody, or unknown while the backend does not answer); ``token`` is this
    instance's fencing token while it leads, else None.
    """

    role: Role
    identity: str
    backend: str
    name: str
    leader: str | None
    token: int | None
    error: str | None = None

    @property
    def leading(self) -> bool:
        return self.role == "leader"

    def as_dict(self) -> dict[str, Any]:
        """The JSON object the endpoints return: identities, names, tokens, and ``error`` with every DSN redacted."""
        shown = asdict(self)
        if self.error is not None:
            shown["error"] = redact_dsn(self.error)
        return shown


def describe_error(exc: BaseException) -> str:
    """``exc`` as the status endpoints show it: its type and its message with every DSN's password hidden."""
    return f"{type(exc).__name__}: {redact_dsn(str(exc))}"


async def _idle(lead: Leadership) -> None:
    await anyio.sleep_forever()


class Campaign:
    """Campaigns on ``elector`` in a background task from :meth:`start` to :meth:`stop`.

    Guarantees:

    * ``work(leadership)`` runs only while this instance leads, as the
      leadership's leader work: on a loss it is cancelled and has stopped
      (within the elector's ``stop_timeout``) before the backend lets go;
    * after a loss the campaign starts again at once; after ``work``
      returns, the leadership is released and the campaign starts again
      after ``restart_delay`` seconds, so that others get a turn;
    * transient backend errors are retried by the elector; a permanent one
      (wrong password, unknown database...) ends the campaign: ``role``
      becomes ``failed``, the error is logged, :meth:`stop` does not raise it;
    * :meth:`stop` cancels the campaign or the work, releases any leadership
      and returns once the backend has let go; it is idempotent, and with
      ``close=True`` (the default) closes the elector too.
    """

    def __init__(
        self,
        elector: Elector,
        work: LeaderWork | None = None,
        *,
        restart_delay: float = 1.0,
        leader_timeout: float = 1.0,
    ) -> None:
        if not (0 <= restart_delay < math.inf):
            raise ValueError(f"restart_delay must be a finite number >= 0, not {restart_delay!r}")
        if not (0 < leader_timeout < math.inf):
            raise ValueError(f"leader_timeout must be a finite number > 0, not {leader_timeout!r}")
        self.elector = elector
        self._work: LeaderWork = work if work is not None else _idle
        self.restart_delay = float(restart_delay)
        self.leader_timeout = float(leader_timeout)
        self._task: asyncio.Task[None] | None = None
        self._tasks = TaskSet()  # owns the campaign's task: stop() cancels and awaits it
        self._lead: Leadership | None = None
        self._error: str | None = None
        self._stopped = False
        self._last_leader: str | None = None

    # --- state ---------------------------------------------------------------------------

    @property
    def leadership(self) -> Leadership | None:
        """This instance's leadership while it is held, else None."""
        lead = self._lead
        return lead if lead is not None and lead.held else None

    @property
    def role(self) -> Role:
        if self._error is not None:
            return "failed"
        if self._task is None or self._stopped or self._task.done():
            return "stopped"
        return "leader" if self.leadership is not None else "follower"

    @property
    def healthy(self) -> bool:
        """True while the campaign runs (leading or campaigning), False once it stopped or failed."""
        return self.role in ("leader", "follower")

    @property
    def error(self) -> str | None:
        """Why the campaign ended, if it ended on a permanent error."""
        return self._error

    async def leader(self) -> str | None:
        """The current leader's identity: this instance's while it leads, else the backend's answer.

        Asks the backend, bounded by ``leader_timeout``; when it does not
        answer in time (or is unavailable) returns the leader last seen.
        """
        if self.leadership is not None:
            return self.elector.identity
        # A campaigning elector follows the leader's changes: no round trip while it has a report.
        last = self.elector.last_leader
        if last is not None and last != self.elector.identity:
            return last
        try:
            with anyio.fail_after(self.leader_timeout):
                who = await self.elector.leader()
        except (TimeoutError, BackendUnavailable, OSError):
            return self._last_leader
        self._last_leader = who
        return who

    async def status(self) -> Status:
        """This instance's role, identity, the current leader and its token while leading."""
        # Role and token read together, before the await: a leadership won meanwhile shows in the next status.
        lead, role = self.leadership, self.role
        who = await self.leader() if self.healthy else None
        return Status(
            role=role,
            identity=self.elector.identity,
            backend=self.elector.backend,
            name=self.elector.name,
            leader=who,
            token=lead.token if lead is not None else None,
            error=self._error,
        )

    # --- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start campaigning in a background task of the running event loop (returns at once)."""
        if self._task is not None:
            raise UsageError("Campaign.start() called twice")
        self._task = self._tasks.start(self._run(), name=f"aioelect campaign {self.elector.name}", on_done=consume)

    async def stop(self, *, close: bool = True) -> None:
        """Stop campaigning or leading, release any leadership, and (``close``) close the elector. Idempotent."""
        self._stopped = True
        # Never interrupted: a caller cancelled now must not leave the release half done.
        await self._tasks.aclose()
        if close:
            with anyio.CancelScope(shield=True):
                await self.elector.aclose()

    async def __aenter__(self) -> Campaign:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _run(self) -> None:
        elector = self.elector
        try:
            while True:
                try:
                    async with leadership(elector) as lead:
                        self._lead = lead
                        try:
                            await self._work(lead)
                        finally:
                            self._lead = None
                except LeadershipLost as exc:
                    log.warning(
                        "%s: leadership of %s lost (%s); campaigning again", elector.identity, elector.name, exc
                    )
                    continue
                await anyio.sleep(self.restart_delay)
        except ElectionError as exc:
            self._error = describe_error(exc)
            log.error("%s: campaign for %s ended: %s", elector.identity, elector.name, self._error)
        except Exception as exc:  # a bug in the leader work: stop, visibly
            self._error = describe_error(exc)
            # The traceback's frames, never the exception's own text (it may hold a DSN with its password).
            frames = "".join(traceback.format_tb(exc.__traceback__)).rstrip()
            log.error(
                "%s: leader work for %s failed; campaign ended: %s\n%s",
                elector.identity,
                elector.name,
                self._error,
                frames,
            )
