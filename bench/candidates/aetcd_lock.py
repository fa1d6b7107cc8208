"""aetcd's own ``Lock`` (TTL 5 s), used the careful way its docs suggest.

``client.lock(key, ttl)``: ``acquire(timeout=None)`` tries a compare-and-put
(a new lease per try) and waits for the key's DELETE event in between. The
lock does not keep itself alive, so the holder calls ``lock.refresh()`` every
TTL/3 and stops acting as leader as soon as a refresh fails or reports the
lease gone (TTL <= 0). That check is ours: aetcd offers nothing more.
"""

from __future__ import annotations

import contextlib
from typing import Any

import aetcd

from ._runner import Candidate, Options, RenewedLock, main


class AetcdLock(RenewedLock):
    def __init__(self, options: Options) -> None:
        host, _, port = options.url.rpartition(":")
        self.client = aetcd.Client(host=host, port=int(port))
        self.ttl = options.ttl
        self.lock: Any = self.client.lock(options.name.encode(), ttl=options.ttl)

    async def setup(self) -> None:
        await self.client.connect()

    async def acquire(self) -> None:
        await self.lock.acquire(timeout=None)

    async def renew(self) -> bool:
        reply = await self.lock.refresh()
        return reply is not None and reply.TTL > 0

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()


def make(options: Options, slot: int) -> Candidate:
    return AetcdLock(options)


if __name__ == "__main__":
    main(make)
