"""A soak candidate: one OS process campaigning with ``aioelect`` ``Elector.run()`` or, with ``--names`` (the
shards workload, :mod:`soak.shards_candidate`), ``aioelect.Shards.run()`` on one shared session.

Its leader work (:func:`fenced_work`; per owned name in the shards workload) writes to the fenced register
every 20-50 ms, each write preceded by a read of ``current_leadership().held``; it writes nothing
while ``held`` is False. Events go to ``--events`` as JSON lines with
``time.monotonic_ns()`` (in the shards workload each with the ``name`` it is about):

* ``start``; ``lead`` (token); ``unheld`` (token: ``held`` read False, no write);
  ``lost`` and ``released`` (token, reason: the elector's events);
* ``act`` (token, t0 = when ``held`` was read True, t1 = when the write returned,
  ok = accepted / refused as stale / null when the write failed, error);
* ``exit`` (tasks: the asyncio tasks still alive after the elector closed), on SIGTERM.

Run as ``python -m soak.candidate`` by :mod:`soak.runner`. :func:`session_for` and :func:`elector_on` (an
instance's shared session and its electors) serve the other processes that run many elections on one session
too: tests/candidates/many_elections.py and bench/shards_members/aioelect_member.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TextIO

import anyio

import aioelect

from .register import Register, SharedRegister

#: Member elections of the shards workload: more than the live candidates a run has at once (joins included).
MAX_INSTANCES = 8

#: How long gRPC's own status tasks of calls the closed channel ended may take to return.
GRPC_SETTLE = 2.0


async def leftover_tasks() -> list[str]:
    """The tasks still running but the caller's, once gRPC has had :data:`GRPC_SETTLE` to finish the status
    tasks of the calls its closed channel ended (on a loaded machine they return a few loop turns later);
    any other task left is reported at once."""
    me = asyncio.current_task()
    deadline = time.monotonic() + GRPC_SETTLE
    while True:
        left = [task for task in asyncio.all_tasks() if task is not me]
        if not left or time.monotonic() > deadline or any("_AioCall" not in repr(task) for task in left):
            return [repr(task) for task in left]
        await asyncio.sleep(0.01)


class Events:
    """JSON lines, one per event, flushed at once (a SIGKILL loses nothing written)."""

    def __init__(self, stream: TextIO, who: str) -> None:
        self._stream = stream
        self._who = who

    def emit(self, event: str, **fields: Any) -> None:
        fields.setdefault("t", time.monotonic_ns())
        self._stream.write(json.dumps({"e": event, "who": self._who, **fields}) + "\n")
        self._stream.flush()


def session_for(backend: str, target: str, identity: str, options: dict[str, Any]) -> Any:
    """An unentered shared session of ``backend`` ("etcd", "postgres" or "mysql") on ``target`` (comma-separated
    etcd endpoints, or a DSN) with the session's ``options``; ``identity`` is the SQL session's."""
    if backend == "etcd":
        return aioelect.EtcdSession(target.split(","), **options)
    if backend == "postgres":
        return aioelect.PostgresSession(target, identity=identity, **options)
    if backend == "mysql":
        return aioelect.MySQLSession(target, identity=identity, **options)
    raise ValueError(f"no shared session for {backend!r}")


def elector_on(backend: str, session: Any, name: str, identity: str) -> aioelect.Elector:
    """The elector of election ``name`` on ``session`` (from :func:`session_for` with the same ``backend``)."""
    if backend == "etcd":
        return aioelect.EtcdElector(session=session, name=name, identity=identity)
    if backend == "postgres":
        return aioelect.PostgresElector(session=session, name=name)
    return aioelect.MySQLElector(session=session, name=name)


async def fenced_work(
    write: Callable[[int, int], Awaitable[bool]], events: Events, rng: random.Random, **about: str
) -> None:
    """Leader work until cancelled: every 20-50 ms, read ``held`` and, while it is True, ``write(token, t0)`` to
    the fenced register; never a write while it is False. Every event carries ``about`` (a shard's ``name``)."""
    lead = aioelect.current_leadership()
    events.emit("lead", **about, token=lead.token)
    told_unheld = False
    while True:
        t0 = time.monotonic_ns()
        if not lead.held:
            if not told_unheld:
                events.emit("unheld", **about, token=lead.token)
                told_unheld = True
            await anyio.sleep(0.01)
            continue
        assert lead.token is not None, "fencing is on: every leadership has a token"
        ok: bool | None
        error = None
        try:
            ok = await write(lead.token, t0)
        except Exception as exc:  # the register is never faulted: a failure is worth a line, not a crash
            ok, error = None, repr(exc)
        events.emit("act", **about, token=lead.token, t0=t0, t1=time.monotonic_ns(), ok=ok, error=error)
        await anyio.sleep(rng.uniform(0.02, 0.05))


async def leader_work(register: Register, events: Events, who: str, rng: random.Random) -> None:
    """Write under the leadership's token until cancelled (on loss, by ``run()``)."""
    await fenced_work(lambda token, t0: register.write(token, who, t0), events, rng)


@asynccontextmanager
async def _one(
    args: argparse.Namespace, options: dict[str, Any], register: Register, events: Events, rng: random.Random
) -> AsyncIterator[Callable[[], Coroutine[Any, Any, Any]]]:
    """One election: the elector (entered) and its ``run()`` of :func:`leader_work`."""
    elector = aioelect.new(**{args.backend: args.target}, name=args.name, identity=args.identity, **options)

    def on_event(event: aioelect.Event) -> None:
        if event.kind in ("lost", "released"):
            events.emit(event.kind, token=event.token, reason=event.reason)

    elector.add_listener(on_event)
    async with elector:
        yield partial(elector.run, leader_work, register, events, args.identity, rng)


@asynccontextmanager
async def _shards(
    args: argparse.Namespace, options: dict[str, Any], register: SharedRegister, events: Events, rng: random.Random
) -> AsyncIterator[Callable[[], Coroutine[Any, Any, Any]]]:
    """The shards workload: one shared session (entered) and ``Shards.run()`` of :func:`fenced_work` per name."""
    names: list[str] = args.names.split(",")
    # The election name of each shard, back to its shard name (for the events).
    of_election = {f"{args.name}/shard/{n}": n for n in names}
    async with session_for(args.backend, args.target, args.identity, options) as session:

        def electors(election: str) -> aioelect.Elector:
            elector = elector_on(args.backend, session, election, args.identity)
            name = of_election.get(election)
            if name is not None:

                def on_event(event: aioelect.Event) -> None:
                    if event.kind in ("lost", "released"):
                        events.emit(event.kind, name=name, token=event.token, reason=event.reason)

                elector.add_listener(on_event)
            return elector

        shards = aioelect.Shards(
            names, group=args.name, electors=electors, identity=args.identity, max_instances=MAX_INSTANCES
        )

        async def work(name: str) -> None:
            """Write under the name's token until cancelled (the name moves, or its leadership ends)."""
            await fenced_work(lambda token, t0: register.write(name, token, args.identity, t0), events, rng, name=name)

        yield partial(shards.run, work)


async def main(args: argparse.Namespace) -> None:
    """Run the workload ``args`` name (the shards workload with ``names``, else one election) until SIGTERM."""
    with open(args.events, "a", encoding="utf-8") as stream:  # noqa: ASYNC230 (once, before anything runs)
        events = Events(stream, args.identity)
        events.emit("start", pid=os.getpid())
        stop = anyio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        rng = random.Random(args.seed)
        options = json.loads(args.options)
        register: Register | SharedRegister
        if args.names:
            register = shared = await SharedRegister.connect(args.register, args.key)
            workload = _shards(args, options, shared, events, rng)
        else:
            register = one = await Register.connect(args.register, args.key)
            workload = _one(args, options, one, events, rng)
        async with workload as campaign, anyio.create_task_group() as tg:
            tg.start_soon(campaign)
            await stop.wait()
            tg.cancel_scope.cancel()
        await register.aclose()
        events.emit("exit", tasks=await leftover_tasks())


def parse(argv: list[str] | None = None, *, shards: bool = False) -> argparse.Namespace:
    """The arguments of one candidate; ``shards``: of the shards workload (``--names``, on a shared session)."""
    parser = argparse.ArgumentParser(prog="python -m soak.shards_candidate" if shards else "python -m soak.candidate")
    backends = ["mysql", "postgres", "etcd"] if shards else ["mysql", "postgres", "etcd", "redis"]
    parser.add_argument("--backend", required=True, choices=backends)
    parser.add_argument("--target", required=True, help="DSN or comma-separated endpoints (through the proxies)")
    parser.add_argument("--name", required=True, help="the Shards group" if shards else "the election")
    if shards:
        parser.add_argument("--names", required=True, help="comma-separated shard names")
    parser.set_defaults(names="")
    parser.add_argument("--identity", required=True)
    what = "the shared session's" if shards else "elector"
    parser.add_argument("--options", default="{}", help=f"JSON object of {what} options")
    parser.add_argument("--register", required=True, help="DSN of the register's PostgreSQL")
    key = "the register rows' prefix: one row per name, KEY/NAME" if shards else "the register row"
    parser.add_argument("--key", required=True, help=key)
    parser.add_argument("--events", required=True, help="file the JSON lines are appended to")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def run(shards: bool = False) -> None:
    """The process's entry point."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(main(parse(shards=shards)))


if __name__ == "__main__":
    run()
