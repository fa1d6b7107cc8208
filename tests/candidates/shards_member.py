"""An instance of aioelect.Shards built from the environment (aioelect.from_env's variables), for crash tests.

Prints one JSON line per owned name as its work starts: ``{"name", "token", "t"}`` with ``time.monotonic()``
(CLOCK_MONOTONIC is system-wide on Linux, so the test compares it with its own clock). Argument: the shard count.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import anyio

import aioelect


async def main(count: int) -> None:
    shards = aioelect.Shards(count, max_instances=5)

    async def work(name: str) -> None:
        lead = aioelect.current_leadership()
        print(json.dumps({"name": name, "token": lead.token, "t": time.monotonic()}), flush=True)
        await anyio.sleep_forever()

    await shards.run(work)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
