"""A tooz lock driven the way tooz's users drive it: one coordinator per candidate."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from tooz import coordination

from ._runner import Candidate


class ToozCandidate(Candidate):
    """``coordinator.get_lock(name)``; blocking ``acquire()`` runs in a thread of its own."""

    def __init__(self, url: str, name: str, *, heart: bool) -> None:
        self.url = url
        self.name = name.encode()
        self.heart = heart
        self.coord: Any = None
        self.lock: Any = None

    async def setup(self) -> None:
        def start() -> Any:
            coord = coordination.get_coordinator(self.url, f"bench-{uuid.uuid4().hex[:12]}".encode())
            # Only drivers whose locks expire (etcd3gw) need the heartbeat thread that refreshes them.
            coord.start(start_heart=self.heart)
            return coord

        self.coord = await asyncio.to_thread(start)
        self.lock = self.coord.get_lock(self.name)

    async def campaign(self) -> None:
        await asyncio.to_thread(self.lock.acquire, True)

    def acting(self) -> bool:
        return bool(self.lock is not None and self.lock.acquired)

    async def release(self) -> None:
        await asyncio.to_thread(self.lock.release)

    async def close(self) -> None:
        if self.coord is not None:
            coord, self.coord = self.coord, None
            await asyncio.to_thread(coord.stop)
