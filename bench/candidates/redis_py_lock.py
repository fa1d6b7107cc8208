"""redis-py's asyncio ``Lock`` (``redis.asyncio.lock.Lock``, TTL 5 s), kept alive the way its docs describe.

``client.lock(name, timeout=5)``: ``acquire()`` polls ``SET NX PX`` every
``sleep`` (0.1 s, the default). The lock does not keep itself alive: the
holder calls ``reacquire()`` (the expiry set back to ``timeout``, only if the
token is still ours) every TTL/3 and stops acting as leader as soon as one
fails. That loop is ours: redis-py offers the lock, not an election.
"""

from __future__ import annotations

import contextlib
from typing import Any

from redis.asyncio import Redis

from ._runner import Candidate, Options, RenewedLock, main


class RedisPyLock(RenewedLock):
    def __init__(self, options: Options) -> None:
        self.client = Redis.from_url(options.url)
        self.ttl = options.ttl
        self.lock: Any = self.client.lock(options.name, timeout=options.ttl)

    async def acquire(self) -> None:
        await self.lock.acquire(blocking=True)

    async def renew(self) -> bool:
        await self.lock.reacquire()  # raises LockNotOwnedError once the lock is not ours
        return True

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.aclose()


def make(options: Options, slot: int) -> Candidate:
    return RedisPyLock(options)


if __name__ == "__main__":
    main(make)
