"""aetcd's own ``Lock`` (TTL 5 s), used the careful way its docs suggest.

``client.lock(key, ttl)``: ``acquire(timeout=None)`` tries a compare-and-put
(a new lease per try) and waits for the key's DELETE event in between. The
lock does not keep itself alive, so the holder calls ``lock.refresh()`` every
TTL/3 and stops acting as leader as soon as a refresh fails or reports the
lease gone (TTL <= 0). That check is ours: aetcd offers nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aetcd

from ._runner import Candidate, Options, main


class AetcdLock(Candidate):
    def __init__(self, options: Options) -> None:
        host, _, port = options.url.rpartition(":")
        self.client = aetcd.Client(host=host, port=int(port))
        self.ttl = options.ttl
        self.lock: Any = self.client.lock(options.name.encode(), ttl=options.ttl)
        self.held = False
        self.refresher: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        await self.client.connect()

    async def campaign(self) -> None:
        await self.lock.acquire(timeout=None)
        self.held = True
        self.refresher = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            while self.held:
                await asyncio.sleep(self.ttl / 3)
                reply = await self.lock.refresh()
                if reply is None or reply.TTL <= 0:
                    break
        except Exception:
            pass
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
            await self.client.close()


def make(options: Options, slot: int) -> Candidate:
    return AetcdLock(options)


if __name__ == "__main__":
    main(make)
