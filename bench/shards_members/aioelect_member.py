"""One aioelect.Shards instance on one shared session (``--backend``: an EtcdSession, a MySQLSession or a
PostgresSession; ``--endpoint`` is the DSN for the SQL ones), reporting ownership as JSON lines.

Lines: ``{"ev": "ready", "t"}`` once the session is entered; ``{"ev": "own", "name", "t"}`` when a name's work
starts; ``{"ev": "drop", "name", "t"}`` when it is cancelled (before the name is let go). ``t`` is
``time.monotonic()`` (system-wide on Linux). SIGTERM leaves gracefully (every name let go, lease revoked or
connection closed).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import anyio

import aioelect
from bench.shards_members._common import arguments, emit
from soak.candidate import elector_on, session_for


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    options = {"ttl": args.ttl} if args.backend == "etcd" else {"lease": args.ttl}
    async with session_for(args.backend, args.endpoint, args.identity, options) as session:
        shards = aioelect.Shards(
            args.names,
            group=args.group,
            identity=args.identity,
            electors=lambda n: elector_on(args.backend, session, n, args.identity),
            max_instances=args.max_instances,
        )

        async def work(name: str) -> None:
            emit("own", name=name)
            try:
                await anyio.sleep_forever()
            finally:
                emit("drop", name=name)

        emit("ready")
        task = asyncio.get_running_loop().create_task(shards.run(work))
        task.add_done_callback(lambda _: stop.set())
        await stop.wait()
        task.cancel()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        if not isinstance(outcome, asyncio.CancelledError):
            emit("failed", error=repr(outcome))
            raise SystemExit(f"Shards.run() ended: {outcome!r}")
    emit("left")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main(arguments(max_instances=8, backend="etcd")))
