"""Leader-only async functions: a decorator whose calls run only on the elected leader (standard library only).

::

    import aioelect
    from aioelect.integrations.jobs import LeaderOnly

    leader_only = LeaderOnly(aioelect.from_env)

    @leader_only
    async def send_digest() -> None:
        lead = aioelect.current_leadership()
        lead.check()
        ...  # write under lead.token

    async def main() -> None:
        async with leader_only:        # campaigns in the background until the block ends
            ...                        # every instance calls send_digest() on its schedule

Why an elected leader and not a try-once lock (``flock -n``, a lock taken
for the length of each call): with a try-once lock, two instances that fire
the same tick each try, and when the first has finished before the second
tries, the second finds the lock free and runs the job again. Here one
instance holds the leadership *between* calls, for as long as it lives; a
call on any other instance is skipped whether or not the leader's run has
finished. A tick falls on no instance only while the leadership changes
hands (see the backends' failover times).

Guarantees:

* a call runs the function only while this instance holds a leadership
  that is :attr:`~aioelect.Leadership.held`; otherwise it returns ``None``
  at once without running it (logged at INFO);
* the function runs as the leadership's leader work: inside it (and its
  tasks) :func:`aioelect.current_leadership` is that leadership; when the
  leadership is lost, runs in progress are cancelled and awaited (at most
  ``stop_timeout``) before the backend lets go, and their callers get
  :class:`~aioelect.LeadershipLost`;
* cancelling a caller cancels its run;
* after a loss the instance campaigns again; leaving ``async with`` stops
  the runs, releases the leadership and, for an elector built from a
  factory, closes it.

Ticks that run at most once, and are caught up after a handover:
:meth:`LeaderOnly.ticks` with a :class:`~aioelect.integrations.schedule.Ticks`
records each due tick in the election's fenced state before it runs it::

    from aioelect.integrations.schedule import Every, Ticks

    @leader_only.ticks(Ticks("digest", Every(60), misfire="run_once"))
    async def send_digest(tick) -> None:
        ...  # tick.number: the same on every instance

    # every instance calls send_digest() (every few seconds, say): the leader
    # runs the ticks due since the last one recorded, the others return None.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from ..core._elector import Elector, Leadership, current_leadership
from ..core._errors import LeadershipLost, UsageError
from ..core._tasks import TaskSet
from ._campaign import Campaign
from .schedule import Tick, Ticks

__all__ = ["LeaderOnly"]

log = logging.getLogger("aioelect.integrations")

P = ParamSpec("P")
T = TypeVar("T")
TickJob = Callable[[Tick], Awaitable[Any]]


class LeaderOnly:
    """Campaigns from ``async with`` to its end; the async functions it decorates run only while it leads.

    ``elector`` is an :class:`~aioelect.Elector` or a factory such as
    :func:`aioelect.from_env` (called on entry, its elector closed on exit;
    an elector given as such is released on exit and left open).
    """

    def __init__(
        self, elector: Elector | Callable[[], Elector], *, stop_timeout: float = 5.0, restart_delay: float = 1.0
    ) -> None:
        if not (0 < stop_timeout < math.inf):
            raise ValueError(f"stop_timeout must be a finite number > 0, not {stop_timeout!r}")
        self._source = elector
        self.stop_timeout = float(stop_timeout)
        self.restart_delay = restart_delay
        self.campaign: Campaign | None = None
        self._owned = False
        self._lead: Leadership | None = None
        self._context: contextvars.Context | None = None
        #: The runs in progress: cancelled, and waited for, before the backend lets go.
        self._running = TaskSet()

    @property
    def leadership(self) -> Leadership | None:
        """The leadership calls run under while it is held, else None."""
        lead = self._lead
        return lead if lead is not None and lead.held else None

    async def __aenter__(self) -> LeaderOnly:
        if self.campaign is not None:
            raise UsageError("LeaderOnly entered twice at once")
        self._owned = not isinstance(self._source, Elector)
        elector = self._source() if self._owned else self._source  # type: ignore[operator]
        if not isinstance(elector, Elector):
            raise TypeError(f"LeaderOnly needs an Elector or a callable that returns one, not {elector!r}")
        self.campaign = Campaign(elector, self._hold, restart_delay=self.restart_delay)
        await self.campaign.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        campaign, self.campaign = self.campaign, None
        if campaign is not None:
            await campaign.stop(close=self._owned)

    async def _hold(self, lead: Leadership) -> None:
        """The leader work: keep the leadership until it is lost or the campaign stops; then stop the runs."""
        self._lead, self._context = lead, contextvars.copy_context()
        try:
            await lead.wait_lost()
        finally:
            self._lead = self._context = None
            self._running.cancel()
            # Never interrupted: the runs must have stopped before the backend lets go, however this ends.
            if not await self._running.wait(self.stop_timeout):
                log.error("%d leader-only run(s) ignored cancellation for %gs", len(self._running), self.stop_timeout)

    def __call__(self, function: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T | None]]:
        """Decorate ``function``: a call runs it only while this instance leads, else returns None at once."""

        @functools.wraps(function)
        async def only_on_the_leader(*args: P.args, **kwargs: P.kwargs) -> T | None:
            lead, context = self._lead, self._context
            if lead is None or context is None or not lead.held:
                log.info("%s not run: this instance does not lead", getattr(function, "__qualname__", function))
                return None

            async def run() -> T:
                return await function(*args, **kwargs)

            # A task created inside the leader work's context sees the leadership as current.
            name = f"aioelect leader-only {getattr(function, '__qualname__', function)}"
            task = context.run(self._running.start, run(), name=name)
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError:
                task.cancel()
                raise
            if task.cancelled():
                raise LeadershipLost(lead.lost_reason or "leadership ended during the run")
            return task.result()

        return only_on_the_leader

    def ticks(self, ticks: Ticks) -> Callable[[TickJob], Callable[[], Coroutine[Any, Any, list[Tick] | None]]]:
        """Decorate ``function(tick)``: a call (no arguments) runs, on the leader, the ticks of ``ticks`` due now.

        On the leader a call records each due tick in the election's fenced
        state, then awaits ``function(tick)`` (the misfire policy of ``ticks``
        applied), and returns the ticks run (``[]``: none due). Elsewhere it
        returns None at once. A tick is never run twice, by this instance or
        another (see :mod:`aioelect.integrations.schedule`); callers on
        every instance may call as often as they like: a tick due in a
        handover runs at the successor's next call.
        """
        if not isinstance(ticks, Ticks):
            raise TypeError(f"LeaderOnly.ticks() takes a Ticks, not {type(ticks).__name__}")

        def decorate(function: TickJob) -> Callable[[], Coroutine[Any, Any, list[Tick] | None]]:
            async def due_ticks() -> list[Tick]:
                return await ticks.run_due(current_leadership(), function)

            functools.update_wrapper(due_ticks, function)
            return self(due_ticks)

        return decorate
