"""A lock loop in the style of celery-redbeat's beat lock, written from its documented behaviour.

redbeat keeps one beat running: it takes a lock key with ``SET NX PX`` and
a random token, retrying every beat interval until it gets it, and on every
tick extends the lock with a script that sets the expiry only while the key
still holds its token; a failed extension stops the beat. The lock timeout is
five beat intervals. Here: TTL 5 s, so a tick (try, or extend) every 1 s;
acting as leader means "no extension has failed since the lock was taken".
A release deletes the key if it still holds our token (one script).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

from redis.asyncio import Redis

from ._runner import Candidate, Options, main

#: Sets the expiry (in ms) only while the key holds our token: 1, else 0.
EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

#: Deletes the key only while it holds our token: 1, else 0.
UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

#: Lock timeout = this many ticks (redbeat's default lock timeout is five times its maximum loop interval).
TICKS_PER_TTL = 5


class RedbeatLoop(Candidate):
    def __init__(self, options: Options) -> None:
        self.client = Redis.from_url(options.url)
        self.key = options.name
        self.ttl_ms = options.ttl * 1000
        self.tick = options.ttl / TICKS_PER_TTL
        self.token = ""
        self.held = False
        self.ticker: asyncio.Task[None] | None = None
        self.extend = self.client.register_script(EXTEND)
        self.unlock = self.client.register_script(UNLOCK)

    async def campaign(self) -> None:
        self.token = secrets.token_hex(16)
        while not await self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
            await asyncio.sleep(self.tick)
        self.held = True
        self.ticker = asyncio.get_running_loop().create_task(self._ticks())

    async def _ticks(self) -> None:
        with contextlib.suppress(Exception):
            while self.held:
                await asyncio.sleep(self.tick)
                if not await self.extend(keys=[self.key], args=[self.token, self.ttl_ms]):
                    break
        self.held = False

    def acting(self) -> bool:
        return self.held

    async def release(self) -> None:
        self.held = False
        if self.ticker is not None:
            self.ticker.cancel()
            self.ticker = None
        await self.unlock(keys=[self.key], args=[self.token])

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.aclose()


def make(options: Options, slot: int) -> Candidate:
    return RedbeatLoop(options)


if __name__ == "__main__":
    main(make)
