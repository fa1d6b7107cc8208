"""A candidate process for the fault-injection suite.

Campaigns with the elector described by its arguments and, while leader,
does "leader work" every ``--act-interval`` seconds: it first reads
``lead.held`` and reports it in a ``tick`` event (so a leader woken from
SIGSTOP shows ``held: false`` before anything else), then checks that it still
holds leadership and prints an ``act`` event. Every event is one JSON line on
stdout with ``time.monotonic()`` (CLOCK_MONOTONIC is system-wide on Linux, so
the test process can compare events from several candidates) as ``t``, and
CLOCK_MONOTONIC_RAW as ``raw``.

Events: ``ready``, ``lead`` (token), ``tick`` (token, held), ``act`` (token),
``lost`` (reason).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

import aioelect
from aioelect import LeadershipLost, leadership


def emit(event: str, **fields: Any) -> None:
    # "raw": CLOCK_MONOTONIC_RAW too, for a test that makes this process's CLOCK_MONOTONIC run slow.
    now = {"t": time.monotonic(), "raw": time.clock_gettime(time.CLOCK_MONOTONIC_RAW)}
    print(json.dumps({"event": event, **now, **fields}), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--target", required=True, help="DSN, endpoints or path")
    parser.add_argument("--name", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--options", default="{}", help="JSON object of elector options")
    parser.add_argument("--act-interval", type=float, default=0.05)
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")
    options = json.loads(args.options)
    elector = aioelect.new(**{args.backend: args.target}, name=args.name, identity=args.identity, **options)
    emit("ready")
    async with elector:
        while True:
            try:
                async with leadership(elector) as lead:
                    emit("lead", token=lead.token)
                    while True:
                        emit("tick", token=lead.token, held=lead.held)  # read before anything else after a wake-up
                        lead.check()  # never act on a leadership that may have passed on
                        emit("act", token=lead.token)
                        await asyncio.sleep(args.act_interval)
            except LeadershipLost as exc:
                emit("lost", reason=exc.reason)


if __name__ == "__main__":
    asyncio.run(main())
