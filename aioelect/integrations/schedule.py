"""Ticks that run at most once across the instances: an "every N seconds" schedule recorded in fenced state.

A schedule numbers its ticks by time (tick ``n`` is due at
``origin + n * seconds``, on the wall clock), so every instance agrees on
which tick is due without talking to the others. :class:`Ticks` keeps, in
the election's :class:`~aioelect.FencedStore`, the number of the last tick
run, and runs a tick only after it has recorded it there::

    import aioelect
    from aioelect.integrations.schedule import Every, Ticks

    digest = Ticks("digest", Every(60), misfire="run_once")

    async def send_digest(tick):
        ...                                   # tick.number, tick.first, tick.due, tick.token

    async with aioelect.leadership(elector) as lead:
        await digest.run(lead, send_digest)    # runs the due ticks until the leadership ends

Guarantees:

* **never twice.** A tick runs only after the leader has recorded it, in
  one fenced compare-and-set of the job's record (the record holds the last
  tick number; the write commits only if the leader's token is the newest
  the election has issued and the record is still what the leader read). A
  deposed leader, however late it wakes, cannot record a tick, so it cannot
  run one: two leaders never run the same tick, and the record never goes
  back. This holds whatever the instances' clocks say;
* **a tick due during a handover runs on the successor**, under the
  misfire policy: ``"run_once"`` (the default) runs the ticks that fell due
  since the record once, as one run numbered by the newest of them
  (``tick.first`` is the oldest it stands for: no tick is lost);
  ``"run_each"`` runs each of them, oldest first; ``"skip"`` runs a tick only
  if it is at most ``grace`` seconds late, and records the later ones as
  skipped without running them;
* **at most once, not exactly once, for a job that dies.** The record is
  committed *before* the job runs. A leader that dies (or is deposed) after
  recording a tick and before its job finished leaves that tick recorded:
  the successor does not run it again. "Ran once" means "was recorded
  once". A job that must finish exactly once makes its own writes idempotent
  per tick number, or writes them in a fenced transaction of its own
  (:func:`aioelect.fenced`) keyed by ``tick.number`` (see the "Exactly once"
  page);
* with no record yet (the first run ever), the newest due tick runs first;
  earlier ticks are not run.

The tick numbers come from each instance's own clock: a successor whose
clock is behind runs the next tick late, one whose clock is ahead runs it
early; neither runs a recorded tick again.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args

import anyio

from .._fence import _TABLE_RE, FENCE_TABLE, fenced
from .._fenced import FencedStore
from ..core._elector import Elector, Leadership
from ..core._values import check_key

__all__ = ["TICKS_DDL_MYSQL", "TICKS_DDL_POSTGRES", "Every", "Misfire", "Tick", "Ticks"]

#: The table of :meth:`Ticks.run_due_in` in the user's database (``{table}`` is its name, ``aioelect_ticks``).
TICKS_DDL_POSTGRES = "CREATE TABLE IF NOT EXISTS {table} (job text PRIMARY KEY, tick bigint NOT NULL)"
TICKS_DDL_MYSQL = (
    "CREATE TABLE IF NOT EXISTS {table} (job VARBINARY(255) NOT NULL PRIMARY KEY, tick BIGINT NOT NULL) ENGINE=InnoDB"
)

log = logging.getLogger("aioelect.integrations")

Misfire = Literal["run_once", "run_each", "skip"]
_MISFIRES: tuple[str, ...] = get_args(Misfire)
#: Unix times up to about the year 3200: an Every must number its ticks exactly until then.
_HORIZON = 4e10


@dataclass(frozen=True)
class Every:
    """Ticks every ``seconds``, tick ``n`` due at ``origin + n * seconds`` (Unix time, seconds)."""

    seconds: float
    origin: float = 0.0

    def __post_init__(self) -> None:
        if not (0 < self.seconds < math.inf):
            raise ValueError(f"Every(seconds) must be a finite number > 0, not {self.seconds!r}")
        if not math.isfinite(self.origin):
            raise ValueError(f"Every(origin=) must be finite, not {self.origin!r}")
        if (abs(self.origin) + _HORIZON) / self.seconds >= 2**53:
            # Tick numbers are computed in floating point: past 2**53 they are no longer exact (and overflow soon).
            raise ValueError(
                f"Every({self.seconds!r}, origin={self.origin!r}): its tick numbers would not be exact "
                "(a period this small, or an origin this far, numbers ticks past 2**53)"
            )

    def tick_at(self, when: float) -> int:
        """The newest tick due at ``when``."""
        return math.floor((when - self.origin) / self.seconds)

    def due(self, number: int) -> float:
        """When tick ``number`` is due."""
        return self.origin + number * self.seconds


@dataclass(frozen=True)
class Tick:
    """One run of a job: tick ``number``, standing for the ticks ``first`` to ``number`` (run_once)."""

    number: int
    first: int
    #: When tick ``number`` was due (Unix time).
    due: float
    #: The fencing token the tick was recorded under.
    token: int


class Ticks:
    """The ticks of one job (``job``: its name in the election's fenced state) on ``schedule``.

    See the module for the guarantees. ``misfire`` is ``"run_once"``,
    ``"run_each"`` or ``"skip"`` (which needs ``grace``, in seconds).
    """

    def __init__(self, job: str, schedule: Every, *, misfire: Misfire = "run_once", grace: float | None = None) -> None:
        if not isinstance(schedule, Every):
            raise TypeError(f"Ticks() takes an Every schedule, not {type(schedule).__name__}")
        if misfire not in _MISFIRES:
            raise ValueError(f"misfire must be one of {', '.join(_MISFIRES)}, not {misfire!r}")
        if misfire == "skip":
            if grace is None or not (0 <= grace < math.inf):
                raise ValueError(f'misfire="skip" needs a finite grace >= 0 (seconds), not {grace!r}')
        elif grace is not None:
            raise ValueError(f'grace applies to misfire="skip" only (misfire is {misfire!r})')
        self.job = job
        self.key = f"ticks/{job}"
        self.schedule = schedule
        self.misfire: Misfire = misfire
        self.grace = grace
        self._stores: dict[int, tuple[Elector, FencedStore]] = {}
        check_key(self.key)  # a job name the store would refuse fails here, not at the first tick

    def __repr__(self) -> str:
        return f"<Ticks {self.job!r} every {self.schedule.seconds:g}s misfire={self.misfire}>"

    def store(self, elector: Elector) -> FencedStore:
        """The fenced state of ``elector``'s election (one store per elector, reused)."""
        kept = self._stores.get(id(elector))
        if kept is None or kept[0] is not elector:
            kept = (elector, FencedStore(elector))
            self._stores[id(elector)] = kept
        return kept[1]

    async def last(self, elector: Elector) -> int | None:
        """The number of the last tick recorded (run or skipped), or None before the first.

        A record written under another ``Every`` (a deploy that changed the
        period or origin) is read by time: the newest tick of this schedule due
        no later than the recorded tick was.
        """
        return self._last(await self.store(elector).get(self.key))

    def _last(self, record: Any) -> int | None:
        if record is None:
            return None
        number = int(record["tick"])
        every = record.get("every") if isinstance(record, dict) else None
        if every is None or (float(every[0]), float(every[1])) == (self.schedule.seconds, self.schedule.origin):
            return number
        due = Every(float(every[0]), float(every[1])).due(number)
        last = self.schedule.tick_at(due)
        if self.schedule.due(last + 1) <= due:  # a rounding at a common boundary
            last += 1
        return last

    def _plan(self, last: int | None, now: float) -> Iterator[tuple[int, int, bool]]:
        """The steps due at ``now`` after tick ``last``: (number, first, run) each, oldest first.

        Lazy, and bounded by the ticks run: a long outage costs no list of the ticks it missed ("skip" records
        them in one step, worked out from the grace, not by looking at each).
        """
        current = self.schedule.tick_at(now)
        first = current if last is None else last + 1
        if current < first:
            return
        if self.misfire == "run_once":
            yield (current, first, True)
            return
        if self.misfire == "run_each":
            for number in range(first, current + 1):
                yield (number, number, True)
            return
        grace = self.grace or 0.0
        # The newest tick more than grace late (lateness falls as the number grows): every tick up to it is
        # skipped, in one write; the later ones run.
        late = self.schedule.tick_at(now - grace)
        while late >= first and now - self.schedule.due(late) <= grace:
            late -= 1
        while late + 1 <= current and now - self.schedule.due(late + 1) > grace:
            late += 1
        if late >= first:
            yield (late, first, False)
        for number in range(max(first, late + 1), current + 1):
            yield (number, number, now - self.schedule.due(number) <= grace)

    async def run_due(self, lead: Leadership, job: Callable[[Tick], Awaitable[Any]]) -> list[Tick]:
        """Record and run the ticks due now (the misfire policy applied); return the ticks run.

        Each tick is recorded by a fenced compare-and-set before ``job(tick)``
        is awaited: :class:`~aioelect.LeadershipLost` if ``lead`` is no longer
        the newest leadership, with nothing recorded or run. The record is
        shielded from cancellation: a caller cancelled while a tick is being
        recorded starts the job once the record is written (the job sees the
        cancellation at its first await).
        """
        store = self.store(lead._elector)
        ran: list[Tick] = []
        record = await store.get(self.key)
        for number, first, run in self._plan(self._last(record), time.time()):
            value = {"tick": number, "token": lead.token, "every": [self.schedule.seconds, self.schedule.origin]}
            # Shielded: a tick recorded is a tick started, even if the caller is cancelled (a release) meanwhile.
            with anyio.CancelScope(shield=True):
                recorded = await store.compare_and_set(lead, self.key, record, value)
            if not recorded:
                # Only a write of this leadership's own can have changed it (one whose answer was lost):
                # read it again on the next pass rather than guess.
                log.warning("%r: the record of %s changed under its leader; reading it again", self, self.job)
                break
            record = value
            assert lead.token is not None
            tick = Tick(number, first, self.schedule.due(number), lead.token)
            if not run:
                log.info("%r: ticks %d..%d skipped (later than grace %gs)", self, first, number, self.grace or 0)
                continue
            if first < number:
                log.info("%r: tick %d runs for the missed ticks %d..%d", self, number, first, number)
            ran.append(tick)
            await job(tick)
        return ran

    async def run_due_in(
        self,
        conn: Any,
        lead: Leadership,
        job: Callable[[Tick], Awaitable[Any]],
        *,
        table: str = "aioelect_ticks",
        fence_table: str = FENCE_TABLE,
    ) -> list[Tick]:
        """Record and run the due ticks in one fenced transaction on ``conn`` (asyncpg or aiomysql), with the job's own
        writes: exactly once for what the job writes on ``conn``.

        The record is the row ``job`` of ``table`` in the user's database
        (:data:`TICKS_DDL_POSTGRES`, :data:`TICKS_DDL_MYSQL`), read under
        ``SELECT ... FOR UPDATE`` inside :func:`aioelect.fenced`, written, and
        committed with what ``job(tick)`` wrote on ``conn`` -- or not at all:
        a job that raises, a leadership lost by the end, or a deposed leader
        (:class:`~aioelect.LeadershipLost`) rolls back the record and the
        job's writes, and the next leader runs those ticks again. Effects the
        job has outside ``conn`` are not undone. Returns the ticks run.
        """
        if not isinstance(table, str) or not _TABLE_RE.fullmatch(table):
            raise ValueError(f"table must be a plain or schema-qualified SQL name, not {table!r}"[:200])
        postgres = type(conn).__module__.split(".")[0] == "asyncpg"

        async def one(sql: str, *args: Any) -> Any:
            if postgres:
                return await conn.fetchrow(sql, *args)
            async with conn.cursor() as cursor:
                await cursor.execute(sql, args)
                return await cursor.fetchone()

        mark = "$1" if postgres else "%s"
        ran: list[Tick] = []
        async with fenced(conn, lead, table=fence_table):
            row = await one(f"SELECT tick FROM {table} WHERE job = {mark} FOR UPDATE", self.job)
            now = time.time()
            steps = self._plan(None if row is None else int(row[0]), now)
            step = next(steps, None)
            if step is None:
                return ran
            newest = self.schedule.tick_at(now)
            if postgres:
                upsert = f"INSERT INTO {table} (job, tick) VALUES ($1, $2) ON CONFLICT (job) DO UPDATE SET tick = $2"
            else:
                upsert = f"INSERT INTO {table} (job, tick) VALUES (%s, %s) ON DUPLICATE KEY UPDATE tick = VALUES(tick)"
            await one(upsert, self.job, newest)
            assert lead.token is not None  # fenced() refused a leadership without one
            for number, first, run in itertools.chain([step], steps):
                if run:
                    tick = Tick(number, first, self.schedule.due(number), lead.token)
                    ran.append(tick)
                    await job(tick)
        return ran

    async def run(self, lead: Leadership, job: Callable[[Tick], Awaitable[Any]]) -> None:
        """Run the due ticks of ``job`` under ``lead`` until the leadership ends (or the caller is cancelled).

        Ends with :class:`~aioelect.LeadershipLost` when ``lead`` is lost.
        """
        while True:
            lead.check()
            await self.run_due(lead, job)
            lead.check()
            wait = self.schedule.due(self.schedule.tick_at(time.time()) + 1) - time.time()
            with lead.guard():
                await anyio.sleep(max(wait, 0.0))
