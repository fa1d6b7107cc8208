"""pottery's Redlock (``AIORedlock``, asyncio) on one master, auto-release 5 s, extended by its holder.

``acquire(blocking=True)`` tries a ``SET NX PX`` on every master and sleeps a
random 0-0.2 s between tries. A Redlock is extended only by ``extend()``, at
most ``num_extensions`` times (3 by default: here unlimited, as a leader
election needs); the holder extends every TTL/3 and stops acting as leader
as soon as one fails (``ExtendUnlockedLock``). That loop is ours: pottery
offers the lock, not an election.
"""

from __future__ import annotations

import contextlib
import sys

from pottery import AIORedlock
from redis.asyncio import Redis

from ._runner import Candidate, Options, RenewedLock, main


class PotteryRedlock(RenewedLock):
    def __init__(self, options: Options) -> None:
        self.client = Redis.from_url(options.url)
        self.ttl = options.ttl
        self.lock = AIORedlock(
            key=options.name, masters={self.client}, auto_release_time=options.ttl, num_extensions=sys.maxsize
        )

    async def acquire(self) -> None:
        await self.lock.acquire(blocking=True)

    async def renew(self) -> bool:
        await self.lock.extend()  # raises once the lock is not ours
        return True

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.aclose()


def make(options: Options, slot: int) -> Candidate:
    return PotteryRedlock(options)


if __name__ == "__main__":
    main(make)
