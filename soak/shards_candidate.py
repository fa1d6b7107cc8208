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

import anyio

import aioelect

from .candidate import Events, elector_on, fenced_work, leftover_tasks, session_for
from .register import SharedRegister

#: Member elections: more than the live candidates a run has at once (joins included).
MAX_INSTANCES = 8


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
                await fenced_work(
                    lambda token, t0: register.write(name, token, args.identity, t0), events, rng, name=name
                )

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
