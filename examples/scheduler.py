"""A cron-like job scheduler whose loops run only on the elected leader.

In the spirit of the service aioelect comes from: several scheduler
instances start, one is elected, and only that one runs the *trigger loop*
(fires each job at its period boundaries) and the *retry loop* (fires failed
jobs again). The others wait as followers and take over when the leader goes.

Run one instance by hand against any backend configured in the environment
(see ``aioelect.from_env``)::

    AIOELECT_FILE=/tmp/sched.lock python examples/scheduler.py --instance a
    AIOELECT_FILE=/tmp/sched.lock python examples/scheduler.py --instance b

A server backend also needs the election's name, specific to this service
(``AIOELECT_MYSQL_DSN=mysql://app@db/app AIOELECT_NAME=scheduler ...``):
without it ``from_env()`` refuses to build the elector.

``examples/demo.py`` starts three of them with ``--json`` and reads their
events. Every job fire checks ``lead.check()`` right before it acts (the
fencing discipline) and carries the leadership's fencing token, so a
downstream system can refuse fires from a deposed leader.

Guarantees: a fire id (``job@HH:MM:SS``, ``job@HH:MM:SS/retryN``) is derived
from the job's schedule alone, so two instances firing at once would fire the same id
(the demo checks that none ever does); a leader only fires slots that fall
after it became leader. Pending retries live in the leader's memory: a retry
due when the leader dies is not fired by the next one (a real service would
keep them in its database, written under the fencing token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

import aioelect
from aioelect import Elector, Leadership, LeadershipLost, leadership

Emit = Callable[..., None]


@dataclass(frozen=True)
class Job:
    """A job fired at every multiple of ``every`` seconds of wall-clock time."""

    name: str
    every: float
    #: A flaky job's first attempt fails on odd slots, so the retry loop has work.
    flaky: bool = False


JOBS = (Job("report", 2.0), Job("cleanup", 3.0), Job("sync", 5.0, flaky=True))
RETRY_AFTER = 1.0


def slot_label(at: float) -> str:
    """A slot's wall-clock time: the same in every instance, readable in the timeline."""
    return time.strftime("%H:%M:%S", time.localtime(at)) + (f".{int(at * 1000) % 1000:03d}" if at % 1 else "")


class Scheduler:
    """One scheduler instance: campaigns forever, runs the loops while leader."""

    def __init__(self, elector: Elector, instance: str, emit: Emit, jobs: tuple[Job, ...] = JOBS) -> None:
        self.elector = elector
        self.instance = instance
        self.emit = emit
        self.jobs = jobs
        self.leading = False
        # Failed fires waiting for the retry loop: (due time, fire id, attempt).
        self._retries: list[tuple[float, str, int]] = []

    async def serve(self) -> None:
        """Campaign, lead until leadership ends, campaign again; until cancelled.

        Raises :class:`aioelect.ElectionError` for a permanent backend error
        (wrong password...): retrying cannot fix it.
        """
        failure: list[aioelect.ElectionError] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._follow)
            try:
                while True:
                    await self._lead_once()
                    await anyio.sleep(0.1)  # let a deposed leader's connection settle before the next campaign
            except aioelect.ElectionError as exc:
                failure.append(exc)  # raised below, not wrapped in the task group's ExceptionGroup
                tg.cancel_scope.cancel()
        if failure:
            raise failure[0]

    async def _lead_once(self) -> None:
        self.emit("campaign")
        lead: Leadership | None = None
        try:
            async with leadership(self.elector) as lead:
                self.leading = True
                self.emit("leader", token=lead.token)
                self._retries.clear()  # a new leadership starts with what it knows: nothing pending
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._until_lost, tg, self._trigger_loop, lead)
                    tg.start_soon(self._until_lost, tg, self._retry_loop, lead)
        except LeadershipLost as exc:
            self.emit("lost", reason=exc.reason, token=lead.token if lead else None)
        finally:
            if self.leading and lead is not None and not lead.lost:
                self.emit("released", token=lead.token)
            self.leading = False

    async def _until_lost(
        self, tg: anyio.abc.TaskGroup, loop: Callable[[Leadership], Awaitable[None]], lead: Leadership
    ) -> None:
        # A failed check() ends both loops; leadership() then raises LeadershipLost for the loss.
        try:
            await loop(lead)
        except LeadershipLost:
            tg.cancel_scope.cancel()

    async def _trigger_loop(self, lead: Leadership) -> None:
        """Fire each job at each period boundary after leadership began (cron-like)."""
        now = time.time()
        next_slot = {job.name: math.floor(now / job.every) + 1 for job in self.jobs}
        while True:
            job = min(self.jobs, key=lambda j: next_slot[j.name] * j.every)
            slot = next_slot[job.name]
            await anyio.sleep(max(0.0, slot * job.every - time.time()))
            next_slot[job.name] = slot + 1
            ok = not (job.flaky and slot % 2 == 1)
            fire_id = f"{job.name}@{slot_label(slot * job.every)}"
            self._fire(lead, "fire", fire_id, job=job.name, ok=ok)
            if not ok:
                self._retries.append((time.time() + RETRY_AFTER, fire_id, 1))

    async def _retry_loop(self, lead: Leadership) -> None:
        """Fire failed jobs again once their retry is due."""
        while True:
            await anyio.sleep(0.2)
            now = time.time()
            due = [r for r in self._retries if r[0] <= now]
            for item in due:
                self._retries.remove(item)
                _, fire_id, attempt = item
                self._fire(lead, "retry", f"{fire_id}/retry{attempt}", job=fire_id.split("@")[0], ok=True)

    def _fire(self, lead: Leadership, event: str, fire_id: str, **fields: Any) -> None:
        # Fencing discipline: confirm leadership right before the action, and
        # hand the token along with it.
        lead.check()
        self.emit(event, id=fire_id, token=lead.token, **fields)

    async def _follow(self) -> None:
        """While following, report who leads (via ``observe()``)."""
        last: object = object()
        while True:
            try:
                async for who in self.elector.observe():
                    if who is not None and who != last and who != self.elector.identity:
                        # Our own campaign may be winning right now: let it say so first.
                        await anyio.sleep(0.2)
                        if not self.leading:
                            self.emit("follow", leader=who)
                    last = who
            except Exception as exc:  # only a view: report and look again
                self.emit("warning", message=f"cannot see the leader: {exc}")
                last = object()
                await anyio.sleep(1.0)


def _parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _emitter(instance: str, as_json: bool) -> Emit:
    started = time.time()

    def emit(event: str, **fields: Any) -> None:
        now = time.time()
        if as_json:
            line = json.dumps({"t": now, "instance": instance, "event": event, **fields})
        else:
            details = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
            line = f"+{now - started:8.3f}s  {instance}  {event.upper():<9} {details}"
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    return emit


async def run(instance: str, options: dict[str, Any], as_json: bool) -> None:
    """Build an elector from the environment and serve until SIGINT/SIGTERM."""
    emit = _emitter(instance, as_json)
    elector = aioelect.from_env(identity=instance, **options)
    emit("start", pid=os.getpid(), backend=elector.backend, name=elector.name)
    async with elector:
        with anyio.CancelScope() as scope:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, scope.cancel)
            await Scheduler(elector, instance, emit).serve()
    emit("stop")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instance", default=f"scheduler-{os.getpid()}", help="this instance's name (its identity)")
    parser.add_argument("--json", action="store_true", help="print events as JSON lines")
    parser.add_argument(
        "--elector-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to aioelect.from_env() (e.g. ttl=3, poll_interval=0.5, fencing=true)",
    )
    args = parser.parse_args(argv)
    options: dict[str, Any] = {}
    for item in args.elector_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--elector-option wants KEY=VALUE, not {item!r}")
        options[key.replace("-", "_")] = _parse_value(value)
    try:
        asyncio.run(run(args.instance, options, args.json))
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    except aioelect.ElectionError as exc:
        print(f"{args.instance}: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
