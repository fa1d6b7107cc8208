"""python-redis-lock (``redis_lock.Lock``, expire 5 s, ``auto_renewal=True``), used as its docs show.

``acquire(blocking=True)``: ``SET NX EX``; while busy, ``BLPOP`` on the
lock's signal list (timeout: the expiry), which ``release()`` pushes to, so a
waiter wakes at once on a release. The renewal thread extends the lock every
2/3 of the expiry; when an extension fails the thread ends, and nothing tells
the holder: acting as leader means "acquired and not yet released", as for
the library's own context manager. It is blocking: each call runs in a thread.
redis-py 8 bounds every read by a 5 s socket timeout unless told otherwise,
which would cut the 5 s ``BLPOP`` short: the client gets the expiry plus 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import redis
import redis_lock

from ._runner import Candidate, Options, main


class PythonRedisLock(Candidate):
    def __init__(self, options: Options) -> None:
        self.client = redis.StrictRedis.from_url(options.url, socket_timeout=options.ttl + 5)
        self.lock: Any = redis_lock.Lock(self.client, options.name, expire=options.ttl, auto_renewal=True)
        self.held = False

    async def campaign(self) -> None:
        await asyncio.to_thread(self.lock.acquire, True)
        self.held = True

    def acting(self) -> bool:
        return self.held

    async def release(self) -> None:
        self.held = False
        await asyncio.to_thread(self.lock.release)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.client.close)


def make(options: Options, slot: int) -> Candidate:
    return PythonRedisLock(options)


if __name__ == "__main__":
    main(make)
