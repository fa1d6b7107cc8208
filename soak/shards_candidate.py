"""A soak candidate of the shards workload: one OS process running ``aioelect.Shards`` over a set of names.

Every election of the process (its member election, each name's) is on one shared session: an
``EtcdSession`` or a ``PostgresSession``/``MySQLSession``. The work of each owned name writes to the fenced
register's row of that name every 20-50 ms, each write preceded by a read of ``current_leadership().held``;
it writes nothing while ``held`` is False. Events go to ``--events`` as JSON lines with
``time.monotonic_ns()``, as :mod:`soak.candidate` writes them, each with the ``name`` it is about:

* ``start``; ``lead`` (name, token); ``unheld`` (name, token); ``lost`` and ``released`` (name, token, reason);
* ``act`` (name, token, t0, t1, ok, error);
* ``exit`` (tasks: the asyncio tasks still alive after the session closed), on SIGTERM.

Run as ``python -m soak.shards_candidate`` by :mod:`soak.runner`.
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
from typing import Any

import anyio

import aioelect

from .candidate import Events, leftover_tasks
from .register import SharedRegister

#: Member elections: more than the live candidates a run has at once (joins included).
MAX_INSTANCES = 8


def session_for(backend: str, target: str, identity: str, options: dict[str, Any]) -> Any:
    if backend == "etcd":
        return aioelect.EtcdSession(target.split(","), **options)
    if backend == "postgres":
        return aioelect.PostgresSession(target, identity=identity, **options)
    return aioelect.MySQLSession(target, identity=identity, **options)


def elector_on(backend: str, session: Any, name: str, identity: str) -> aioelect.Elector:
    if backend == "etcd":
        return aioelect.EtcdElector(session=session, name=name, identity=identity)
    if backend == "postgres":
        return aioelect.PostgresElector(session=session, name=name)
    return aioelect.MySQLElector(session=session, name=name)


async def main(args: argparse.Namespace) -> None:
    with open(args.events, "a", encoding="utf-8") as stream:  # noqa: ASYNC230 (once, before anything runs)
        events = Events(stream, args.identity)
        events.emit("start", pid=os.getpid())
        stop = anyio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        names: list[str] = args.names.split(",")
        register = await SharedRegister.connect(args.register, args.key)
        rng = random.Random(args.seed)
        options = json.loads(args.options)
        group = args.name
        # The election name of each shard, back to its shard name (for the events).
        of_election = {f"{group}/shard/{n}": n for n in names}

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
                names, group=group, electors=electors, identity=args.identity, max_instances=MAX_INSTANCES
            )

            async def work(name: str) -> None:
                """Write under the name's token until cancelled (the name moves, or its leadership ends)."""
                lead = aioelect.current_leadership()
                events.emit("lead", name=name, token=lead.token)
                told_unheld = False
                while True:
                    t0 = time.monotonic_ns()
                    if not lead.held:
                        if not told_unheld:
                            events.emit("unheld", name=name, token=lead.token)
                            told_unheld = True
                        await anyio.sleep(0.01)
                        continue
                    assert lead.token is not None, "fencing is on: every leadership has a token"
                    ok: bool | None
                    error = None
                    try:
                        ok = await register.write(name, lead.token, args.identity, t0)
                    except Exception as exc:  # the register is never faulted: a failure is worth a line
                        ok, error = None, repr(exc)
                    events.emit("act", name=name, token=lead.token, t0=t0, t1=time.monotonic_ns(), ok=ok, error=error)
                    await anyio.sleep(rng.uniform(0.02, 0.05))

            async with anyio.create_task_group() as tg:
                tg.start_soon(shards.run, work)
                await stop.wait()
                tg.cancel_scope.cancel()
        await register.aclose()
        events.emit("exit", tasks=await leftover_tasks())


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m soak.shards_candidate")
    parser.add_argument("--backend", required=True, choices=["mysql", "postgres", "etcd"])
    parser.add_argument("--target", required=True, help="DSN or comma-separated endpoints (through the proxies)")
    parser.add_argument("--name", required=True, help="the Shards group")
    parser.add_argument("--names", required=True, help="comma-separated shard names")
    parser.add_argument("--identity", required=True)
    parser.add_argument("--options", default="{}", help="JSON object of the shared session's options")
    parser.add_argument("--register", required=True, help="DSN of the register's PostgreSQL")
    parser.add_argument("--key", required=True, help="the register rows' prefix: one row per name, KEY/NAME")
    parser.add_argument("--events", required=True, help="file the JSON lines are appended to")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(main(parse()))
