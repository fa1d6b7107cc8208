"""APScheduler 3.x: an ``AsyncIOScheduler`` whose jobs run only while this instance leads (extra ``apscheduler``).

Every instance adds the same jobs to its own scheduler and hands it to
:class:`LeaderScheduler`; the instances campaign, and only the leader's
scheduler processes jobs::

    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    import aioelect
    from aioelect.integrations.apscheduler import LeaderScheduler

    async def report() -> None:
        lead = aioelect.current_leadership()
        lead.check()                      # right before an act only the leader may do
        await write_report(fencing_token=lead.token)   # your write, under the fencing token

    scheduler = AsyncIOScheduler()
    # A grace time longer than any handover, so that a run due during one still runs once.
    scheduler.add_job(report, "interval", minutes=5, id="report", misfire_grace_time=900)
    async with LeaderScheduler(scheduler, aioelect.from_env()):
        await stop_requested.wait()

``examples/recipes/scheduler_apscheduler.py`` is the complete program.

Guarantees:

* the scheduler starts paused and processes jobs only while this instance
  holds a leadership: it is resumed when the leadership is acquired and
  paused when it is lost or released;
* a run starts only while the leadership is :attr:`~aioelect.Leadership.held`;
  coroutine jobs that are still running when it ends are cancelled and
  awaited (at most ``stop_timeout`` seconds) before the backend lets go, so
  they have stopped before another instance can lead. A cancelled run ends
  with APScheduler's ``EVENT_JOB_ERROR`` carrying the ``CancelledError``;
* coroutine jobs and the tasks they start see the leadership they run
  under through :func:`aioelect.current_leadership` (and
  :attr:`LeaderScheduler.leadership`): its ``token`` and ``check()``;
* after a loss the instance campaigns again; :meth:`LeaderScheduler.stop`
  (or leaving ``async with``) releases the leadership, shuts the scheduler
  down and closes the elector.

Functions that are not coroutines run in the event loop's thread pool, as
APScheduler runs them: they are not started without a held leadership, but
a thread cannot be cancelled, so a loss waits for them (``stop_timeout``)
and they must call ``current_leadership().check()`` before they act.

Runs due during a handover. Each instance keeps its own schedule (the
default ``MemoryJobStore``); a follower's paused scheduler leaves its
jobs' next run times where they were. When an instance becomes leader,
APScheduler sees every run that fell due while it followed -- including
those the previous leader ran, and those of the gap between the two
leaders -- as *missed*, and applies the job's options:

* ``coalesce=True`` (APScheduler's default): the missed runs of a job are
  run once, at once, if the latest of them is at most
  ``misfire_grace_time`` seconds old (default 1), else none is run
  (``EVENT_JOB_MISSED``). The usual choice: the new leader catches up with
  one run.
* ``coalesce=False``: each missed run younger than ``misfire_grace_time``
  runs, one after another, at once; with ``misfire_grace_time=None`` all of
  them, however old: a burst that repeats the previous leader's runs.
* A run that falls due while nobody leads (the old leader fenced itself,
  the new one has not yet taken over) is caught up in the same way when
  the new leader resumes, so with ``coalesce=True`` and a grace time longer
  than the handover nothing is skipped; the price is that the slot the old
  leader ran last may run again on the new one. Jobs that must run exactly
  once per slot write their slot under the fencing token (or idempotently)
  where they act.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
from collections.abc import Callable
from typing import Any

import anyio

from .._elector import Elector, Leadership
from ._campaign import Campaign, Role, Status

try:
    from apscheduler.events import EVENT_SCHEDULER_SHUTDOWN
    from apscheduler.executors.asyncio import AsyncIOExecutor
    from apscheduler.executors.base import run_coroutine_job, run_job
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.schedulers.base import STATE_STOPPED
    from apscheduler.util import iscoroutinefunction_partial
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "aioelect.integrations.apscheduler needs APScheduler 3.x: pip install 'aioelect[apscheduler]'"
    ) from exc

__all__ = ["LeaderExecutor", "LeaderScheduler"]

log = logging.getLogger("aioelect.integrations.apscheduler")


class LeaderExecutor(AsyncIOExecutor):  # type: ignore[misc]
    """APScheduler's asyncio executor, starting runs only under a held leadership, in its context.

    :class:`LeaderScheduler` installs it as the scheduler's ``default``
    executor; it is not meant to be used alone.
    """

    def __init__(self) -> None:
        super().__init__()
        self.leadership: Leadership | None = None
        #: The leader work's context: runs see the leadership through aioelect.current_leadership().
        self.context: contextvars.Context | None = None
        self._running: set[asyncio.Future[Any]] = set()

    def _do_submit_job(self, job: Any, run_times: list[Any]) -> None:
        lead, context = self.leadership, self.context
        if lead is None or context is None or not lead.held:
            log.info('run of job "%s" not started: this instance does not lead', job.id)
            self._run_job_success(job.id, [])
            return

        def done(future: asyncio.Future[Any]) -> None:
            self._running.discard(future)
            self._pending_futures.discard(future)
            try:
                events = future.result()
            except BaseException as exc:  # a thread job cancelled before it started
                self._run_job_error(job.id, exc, exc.__traceback__)
            else:
                self._run_job_success(job.id, events)

        loop: asyncio.AbstractEventLoop = self._eventloop
        future: asyncio.Future[Any]
        if iscoroutinefunction_partial(job.func):
            coro = run_coroutine_job(job, job._jobstore_alias, run_times, self._logger.name)
            # A task created inside context.run() copies that context: the leadership is current in the run.
            future = context.run(loop.create_task, coro)
        else:
            future = loop.run_in_executor(
                None, context.copy().run, run_job, job, job._jobstore_alias, run_times, self._logger.name
            )
        future.add_done_callback(done)
        self._pending_futures.add(future)
        self._running.add(future)

    async def stop_runs(self, timeout: float) -> None:  # noqa: ASYNC109
        """Cancel the runs in progress and wait for them to end, at most ``timeout`` seconds (shielded)."""
        running = list(self._running)
        for future in running:
            future.cancel()
        if not running:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(timeout) as scope:
            await asyncio.wait(running)
        if scope.cancelled_caught:
            log.error(
                "%d job run(s) still running %gs after the leadership ended (threads cannot be cancelled)",
                sum(not f.done() for f in running),
                timeout,
            )


class LeaderScheduler:
    """Runs ``scheduler``'s jobs only while ``elector`` leads; see the module's guarantees.

    ``scheduler`` must be an ``AsyncIOScheduler`` that is not started and
    has no ``default`` executor of its own (this class brings one).
    ``stop_timeout`` bounds the wait for runs in progress when leadership
    ends; ``restart_delay`` is the pause before campaigning again after a
    voluntary release.
    """

    def __init__(
        self,
        scheduler: AsyncIOScheduler,
        elector: Elector,
        *,
        stop_timeout: float = 5.0,
        restart_delay: float = 1.0,
    ) -> None:
        if not isinstance(scheduler, AsyncIOScheduler):
            raise TypeError(f"LeaderScheduler needs an AsyncIOScheduler, not {type(scheduler).__name__}")
        if scheduler.state != STATE_STOPPED:
            raise ValueError("LeaderScheduler needs a scheduler that is not started: it starts it paused")
        if not (0 < stop_timeout < math.inf):
            raise ValueError(f"stop_timeout must be a finite number > 0, not {stop_timeout!r}")
        self.scheduler = scheduler
        self.executor = LeaderExecutor()
        try:
            scheduler.add_executor(self.executor, "default")
        except ValueError:
            raise ValueError(
                "the scheduler already has a 'default' executor: LeaderScheduler installs its own "
                "(LeaderExecutor), so leave 'default' unconfigured"
            ) from None
        self.stop_timeout = float(stop_timeout)
        self.campaign = Campaign(elector, self._lead, restart_delay=restart_delay)
        self._on_change: list[Callable[[bool], object]] = []

    @property
    def elector(self) -> Elector:
        return self.campaign.elector

    @property
    def leadership(self) -> Leadership | None:
        """The leadership the jobs run under, while it is held; else None."""
        return self.campaign.leadership

    @property
    def role(self) -> Role:
        return self.campaign.role

    async def status(self) -> Status:
        return await self.campaign.status()

    async def start(self) -> None:
        """Start the scheduler paused and campaign in the background (returns at once)."""
        self.scheduler.start(paused=True)
        await self.campaign.start()

    async def stop(self) -> None:
        """Stop runs in progress, release leadership, shut the scheduler down and close the elector. Idempotent."""
        await self.campaign.stop()
        if self.scheduler.state != STATE_STOPPED:
            # AsyncIOScheduler shuts down in a callback of the event loop: wait for it (bounded).
            down = anyio.Event()

            def on_shutdown(event: Any) -> None:
                down.set()

            self.scheduler.add_listener(on_shutdown, EVENT_SCHEDULER_SHUTDOWN)
            self.scheduler.shutdown(wait=False)
            with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                await down.wait()
            self.scheduler.remove_listener(on_shutdown)

    async def __aenter__(self) -> LeaderScheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _lead(self, lead: Leadership) -> None:
        executor = self.executor
        executor.leadership = lead
        executor.context = contextvars.copy_context()
        log.info("%s leads %s: resuming the scheduler (token %s)", lead.identity, self.elector.name, lead.token)
        self.scheduler.resume()
        try:
            await lead.wait_lost()
        finally:
            # Pause first (no new run), then stop the runs in progress: all before the backend lets go.
            if self.scheduler.state != STATE_STOPPED:
                self.scheduler.pause()
            executor.leadership = None
            executor.context = None
            log.info("%s no longer leads %s: scheduler paused", lead.identity, self.elector.name)
            await executor.stop_runs(self.stop_timeout)
