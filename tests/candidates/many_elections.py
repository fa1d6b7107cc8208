"""One process of a service: one shared session campaigning in ``--count`` elections, for the scale tests.

Prints ``{"held": n, "lost": m}`` (leaderships held now, lost so far: each is campaigned for again) every 0.5 s; on
SIGTERM, ``{"names": [...]}`` (the elections it leads at that moment, before letting any go), then closes the
session and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from typing import Any

import aioelect
from soak.candidate import elector_on, session_for

SQL: dict[str, Any] = {"check_interval": 0.5, "check_timeout": 2.0, "lease": 10, "poll_interval": 1.0}


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    leads: dict[str, aioelect.Leadership] = {}

    lost = 0

    async def campaign(e: aioelect.Elector) -> None:
        nonlocal lost
        while True:  # as Elector.run() does: campaign again after a loss
            lead = leads[e.name] = await e.acquire()
            await lead.wait_lost()
            lost += 1

    options = {"ttl": 10} if args.backend == "etcd" else SQL
    async with session_for(args.backend, args.target, args.identity, options) as session:
        tasks = []
        for i in range(args.count):
            if args.batch and i and i % args.batch == 0:
                await asyncio.sleep(args.batch_every)
            e = elector_on(args.backend, session, f"{args.prefix}-{i}", args.identity)
            tasks.append(asyncio.create_task(campaign(e)))
        while not stop.is_set():
            print(json.dumps({"held": sum(lead.held for lead in leads.values()), "lost": lost}), flush=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        print(json.dumps({"names": sorted(n for n, lead in leads.items() if lead.held)}), flush=True)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True, choices=["etcd", "mysql", "postgres"])
    parser.add_argument("--target", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--batch", type=int, default=0, help="start campaigns this many at a time (0: all at once)")
    parser.add_argument("--batch-every", type=float, default=1.0, help="seconds between batches")
    asyncio.run(main(parser.parse_args()))
