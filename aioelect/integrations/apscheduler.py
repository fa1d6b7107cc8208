"""APScheduler 3.x: an ``AsyncIOScheduler`` whose jobs run only while this instance leads (extra ``apscheduler``).

(:class:`ShardedScheduler`, at the end, spreads the jobs over the instances instead: each job runs only on the
instance that owns its id in an :class:`aioelect.Shards`.)

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
  where they act, or use ``fenced=True``:

Runs recorded in fenced state (``LeaderScheduler(..., fenced=True)``). The
executor records each run time of a job (key ``apscheduler/{job id}`` of the
election's :class:`~aioelect.FencedStore`: the newest run time recorded, and
the token) with a fenced compare-and-set before it runs it, and does not
start a run time at or before the one recorded. So:

* a run time is never run twice, by this instance or another: a deposed
  leader cannot record it (its write is refused by the server), and a
  successor skips what its predecessor recorded;
* with ``coalesce=True`` and a ``misfire_grace_time`` longer than a
  handover, the run times that fell due during the handover run once on the
  successor; with ``coalesce=False`` each of them runs; past the grace time
  APScheduler reports them missed (``EVENT_JOB_MISSED``) and they are
  recorded without running;
* at most once: a leader that dies after recording a run time and before
  the run finished leaves it recorded, and nobody runs it again;
* every instance must compute the same run times: give ``interval``
  triggers the same ``start_date`` everywhere (their default start is the
  moment each instance added the job), or use ``cron`` triggers;
* needs a backend with fenced state (not ``local``; PostgreSQL with
  ``schema=``, MySQL and PostgreSQL with fencing on): the constructor
  refuses one without.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import anyio

from .._fenced import FencedStore
from .._shards import Shards
from ..core._elector import Elector, Leadership
from ..core._tasks import TaskSet, consume
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

__all__ = ["LeaderExecutor", "LeaderScheduler", "ShardedExecutor", "ShardedScheduler"]

log = logging.getLogger("aioelect.integrations.apscheduler")


async def _shut_down(scheduler: AsyncIOScheduler) -> None:
    """Shut ``scheduler`` down unless it is stopped, and wait for it (bounded, shielded)."""
    if scheduler.state == STATE_STOPPED:
        return
    # AsyncIOScheduler shuts down in a callback of the event loop: wait for it (bounded).
    down = anyio.Event()

    def on_shutdown(event: Any) -> None:
        down.set()

    scheduler.add_listener(on_shutdown, EVENT_SCHEDULER_SHUTDOWN)
    scheduler.shutdown(wait=False)
    with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
        await down.wait()
    scheduler.remove_listener(on_shutdown)


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
        #: Runs in progress, with the id of their job.
        self._running: dict[asyncio.Future[Any], str] = {}
        #: With ``fenced=True``: the election's fenced state, where each job's last run time is recorded.
        self.store: FencedStore | None = None

    def _lease(self, job: Any) -> tuple[Leadership | None, contextvars.Context | None]:
        """The leadership a run of ``job`` would run under, and its context."""
        return self.leadership, self.context

    def _do_submit_job(self, job: Any, run_times: list[Any]) -> None:
        lead, context = self._lease(job)
        if lead is None or context is None or not lead.held:
            log.info('run of job "%s" not started: this instance does not lead it', job.id)
            self._run_job_success(job.id, [])
            return

        def done(future: asyncio.Future[Any]) -> None:
            self._running.pop(future, None)
            self._pending_futures.discard(future)
            try:
                events = future.result()
            except BaseException as exc:  # a thread job cancelled before it started
                self._run_job_error(job.id, exc, exc.__traceback__)
            else:
                self._run_job_success(job.id, events)

        loop: asyncio.AbstractEventLoop = self._eventloop
        future: asyncio.Future[Any]
        if self.store is not None:
            future = context.run(loop.create_task, self._recorded_runs(self.store, lead, job, run_times))
        elif iscoroutinefunction_partial(job.func):
            coro = run_coroutine_job(job, job._jobstore_alias, run_times, self._logger.name)
            # A task created inside context.run() copies that context: the leadership is current in the run.
            future = context.run(loop.create_task, coro)
        else:
            future = loop.run_in_executor(
                None, context.copy().run, run_job, job, job._jobstore_alias, run_times, self._logger.name
            )
        future.add_done_callback(done)
        self._pending_futures.add(future)
        self._running[future] = job.id

    async def _recorded_runs(self, store: FencedStore, lead: Leadership, job: Any, run_times: list[Any]) -> list[Any]:
        """Run ``job`` at each of ``run_times`` not recorded yet, each recorded (fenced) before it runs."""
        key = f"apscheduler/{job.id}"
        record = await store.get(key)
        events: list[Any] = []
        for run_time in run_times:
            at = run_time.timestamp()
            if record is not None and at <= record["run_time"]:
                log.info('run of job "%s" at %s not started: already recorded', job.id, run_time)
                continue
            value = {"run_time": at, "token": lead.token}
            if not await store.compare_and_set(lead, key, record, value):
                log.warning('the record of job "%s" changed under its leader: run at %s not started', job.id, run_time)
                break
            record = value
            if iscoroutinefunction_partial(job.func):
                events += await run_coroutine_job(job, job._jobstore_alias, [run_time], self._logger.name)
            else:
                runs = functools.partial(run_job, job, job._jobstore_alias, [run_time], self._logger.name)
                events += await asyncio.get_running_loop().run_in_executor(None, contextvars.copy_context().run, runs)
        return events

    async def stop_runs(self, timeout: float, job_id: str | None = None) -> None:  # noqa: ASYNC109
        """Cancel the runs in progress (of ``job_id`` only, if given) and wait for them to end, at most ``timeout``
        seconds (shielded)."""
        running = [f for f, of in self._running.items() if job_id is None or of == job_id]
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
    voluntary release. ``fenced=True`` records each run time of each job in
    the election's :class:`~aioelect.FencedStore` before it runs (see the
    module's "Runs recorded in fenced state").
    """

    def __init__(
        self,
        scheduler: AsyncIOScheduler,
        elector: Elector,
        *,
        stop_timeout: float = 5.0,
        restart_delay: float = 1.0,
        fenced: bool = False,
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
        if fenced:
            self.executor.store = FencedStore(elector)  # refuses a backend without fenced state, here
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
        await _shut_down(self.scheduler)

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


class ShardedExecutor(LeaderExecutor):
    """APScheduler's asyncio executor, starting a run of a job only under the held leadership of the job's id.

    :class:`ShardedScheduler` installs it as the scheduler's ``default``
    executor; it is not meant to be used alone.
    """

    def __init__(self) -> None:
        super().__init__()
        #: Per owned job id: its leadership and the context of its leader work.
        self.leases: dict[str, tuple[Leadership, contextvars.Context]] = {}

    def _lease(self, job: Any) -> tuple[Leadership | None, contextvars.Context | None]:
        return self.leases.get(job.id, (None, None))


class ShardedScheduler:
    """Runs each of ``scheduler``'s jobs only on the instance that owns the job's id in ``shards``.

    Every instance adds the same jobs (same ids) to its own scheduler and
    builds the same :class:`~aioelect.Shards` over those ids::

        scheduler = AsyncIOScheduler()
        for tenant in tenants:
            scheduler.add_job(sync, "interval", minutes=1, args=[tenant], id=f"sync-{tenant}")
        shards = aioelect.Shards([job.id for job in scheduler.get_jobs()], group="billing/sync")
        async with ShardedScheduler(scheduler, shards):
            await stop_requested.wait()

    Guarantees:

    * a run of a job starts only while this instance holds the leadership
      of the job's id (its own election, see :class:`~aioelect.Shards`);
      elsewhere the run is skipped (it counts as done, and the job's next
      run time moves on as usual);
    * coroutine runs of a job that are still running when its id moves or
      is lost are cancelled and awaited (at most ``stop_timeout`` seconds)
      before the id's leadership is let go, so they have stopped before
      another instance can own it;
    * inside a run, :func:`aioelect.current_leadership` is the leadership of
      the job's id: its ``token`` and ``check()``;
    * a job whose id is not among ``shards.names`` would never run: a
      ValueError at :meth:`start` names it.

    Runs that fall due while a job's id moves (between the old owner's
    release and the new owner's acquisition) are skipped, not caught up:
    every scheduler keeps running its schedule, and a skipped run is not
    missed in APScheduler's sense. Thread (non-coroutine) jobs are not
    cancelled: as with :class:`LeaderScheduler`, a move waits for them
    (``stop_timeout``) and they must ``check()`` before they act.
    """

    def __init__(self, scheduler: AsyncIOScheduler, shards: Shards, *, stop_timeout: float = 5.0) -> None:
        if not isinstance(scheduler, AsyncIOScheduler):
            raise TypeError(f"ShardedScheduler needs an AsyncIOScheduler, not {type(scheduler).__name__}")
        if scheduler.state != STATE_STOPPED:
            raise ValueError("ShardedScheduler needs a scheduler that is not started: it starts it")
        if not isinstance(shards, Shards):
            raise TypeError(f"ShardedScheduler needs aioelect.Shards, not {type(shards).__name__}")
        if not (0 < stop_timeout < math.inf):
            raise ValueError(f"stop_timeout must be a finite number > 0, not {stop_timeout!r}")
        self.scheduler = scheduler
        self.shards = shards
        self.executor = ShardedExecutor()
        try:
            scheduler.add_executor(self.executor, "default")
        except ValueError:
            raise ValueError(
                "the scheduler already has a 'default' executor: ShardedScheduler installs its own "
                "(ShardedExecutor), so leave 'default' unconfigured"
            ) from None
        self.stop_timeout = float(stop_timeout)
        #: The shards' run, from start() to stop().
        self._tasks = TaskSet()

    @property
    def owned(self) -> frozenset[str]:
        """The ids of the jobs this instance runs now."""
        return self.shards.owned

    async def start(self) -> None:
        """Start the scheduler and take part in the shards in the background (returns at once)."""
        names = set(self.shards.names)
        strays = sorted(job.id for job in self.scheduler.get_jobs() if job.id not in names)
        if strays:
            raise ValueError(f"jobs whose id is not among the shards' names would never run: {strays}")
        self.scheduler.start()
        self._tasks.start(self._run(), name=f"aioelect shards {self.shards.group}", on_done=consume)

    async def _run(self) -> None:
        try:
            await self.shards.run(self._own)
        except Exception:
            log.exception("the shards of %s stopped: no job runs on this instance", self.shards.group)
            raise

    async def _own(self, job_id: str) -> None:
        lead = self.shards.leadership(job_id)
        assert lead is not None  # the work of an owned name runs under its leadership
        self.executor.leases[job_id] = (lead, contextvars.copy_context())
        log.info("%s owns job %s (token %s)", lead.identity, job_id, lead.token)
        try:
            await anyio.sleep_forever()
        finally:
            del self.executor.leases[job_id]
            await self.executor.stop_runs(self.stop_timeout, job_id)

    async def stop(self) -> None:
        """Stop every run in progress, let every job id go, and shut the scheduler down. Idempotent."""
        await self._tasks.aclose()
        await _shut_down(self.scheduler)

    async def __aenter__(self) -> ShardedScheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
