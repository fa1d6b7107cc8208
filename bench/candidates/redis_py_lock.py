"""redis-py's asyncio ``Lock`` (``redis.asyncio.lock.Lock``, TTL 5 s), kept alive the way its docs describe.

``client.lock(name, timeout=5)``: ``acquire()`` polls ``SET NX PX`` every
``sleep`` (0.1 s, the default). The lock does not keep itself alive: the
holder calls ``reacquire()`` (the expiry set back to ``timeout``, only if the
token is still ours) every TTL/3 and stops acting as leader as soon as one
fails. That loop is ours: redis-py offers the lock, not an election.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis.asyncio import Redis

from ._runner import Candidate, Options, main


class RedisPyLock(Candidate):
    def __init__(self, options: Options) -> None:
        self.client = Redis.from_url(options.url)
        self.ttl = options.ttl
        self.lock: Any = self.client.lock(options.name, timeout=options.ttl)
        self.held = False
        self.refresher: asyncio.Task[None] | None = None

    async def campaign(self) -> None:
        await self.lock.acquire(blocking=True)
        self.held = True
        self.refresher = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        with contextlib.suppress(Exception):
            while self.held:
                await asyncio.sleep(self.ttl / 3)
                await self.lock.reacquire()
        self.held = False

    def acting(self) -> bool:
        return self.held

    async def release(self) -> None:
        self.held = False
        if self.refresher is not None:
            self.refresher.cancel()
            self.refresher = None
        await self.lock.release()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.aclose()


def make(options: Options, slot: int) -> Candidate:
    return RedisPyLock(options)


if __name__ == "__main__":
    main(make)
