"""A single-host candidate process for tests/test_file.py.

Campaigns on a lock file with :class:`aioelect.FileElector`, ``--rounds``
times (0: forever). Each leadership holds for ``--hold`` seconds inside a
critical section guarded by a marker file created with ``O_EXCL``: if two
processes ever led at once, one of them fails to create it and reports an
``overlap``. Events are JSON lines on stdout with ``time.monotonic()``
(system-wide on Linux): ``ready``, ``lead`` (token), ``overlap``, ``done``
(end of one leadership's work, before release), ``finished``. With
``--barrier PATH`` it waits (at most 30 s) for PATH to exist before
campaigning, so that several processes start campaigning together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import anyio

from aioelect import FileElector, leadership


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--hold", type=float, default=0.01)
    parser.add_argument("--marker", default=None, help="critical-section marker file")
    parser.add_argument("--barrier", default=None, help="campaign only once this file exists")
    parser.add_argument("--poll-interval", type=float, default=0.05)
    args = parser.parse_args()
    elector = FileElector(args.path, identity=args.identity, poll_interval=args.poll_interval)
    emit("ready")
    if args.barrier:
        deadline = time.monotonic() + 30
        while not await anyio.Path(args.barrier).exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
    async with elector:
        done = 0
        while args.rounds == 0 or done < args.rounds:
            async with leadership(elector) as lead:
                emit("lead", token=lead.token)
                fd = -1
                if args.marker:
                    try:
                        fd = os.open(args.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                    except FileExistsError:
                        emit("overlap")
                await asyncio.sleep(args.hold)
                if fd >= 0:
                    os.close(fd)
                    os.unlink(args.marker)
                emit("done", token=lead.token)
            done += 1
    emit("finished")


if __name__ == "__main__":
    asyncio.run(main())
