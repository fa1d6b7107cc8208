"""How much campaign traffic one connection has in flight: a bounded number of requests at a time.

One event loop runs every campaign of a process, and one connection carries
every campaign of a shared :class:`~._shared.EtcdSession`. A thousand
campaigns started at once would put a thousand requests and watches in
flight together: each turn of the loop then carries a step of every one of
them, and the keep-alive that confirms every leadership on the connection,
a few turns of the loop long, is late past the renew deadline on a loaded
machine. Queued here, the campaigns wait without costing a turn of the loop.

Guarantees (:class:`Admission`): at most ``limit`` admitted at once; the
waiters are admitted in order of arrival, a held leadership's
(:attr:`Lane.HOLD`) before any campaign's; a waiter cancelled once admitted
hands its turn on, so no turn is lost. What is not given a lane never
waits here: the lease (grant, keep-alive, revoke) and the release (resign,
withdrawal).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
from collections.abc import AsyncIterator

__all__ = ["LIMIT", "Admission", "Lane"]

#: Requests and watch creations of one connection in flight at once. Far above what one campaign needs, and
#: enough to keep etcd busy (it applies writes one at a time), while one turn of the loop stays short.
LIMIT = 32


class Lane(enum.Enum):
    """Which queue a request waits in, first served first."""

    #: A held leadership watching its key, or reading it after the watch broke.
    HOLD = 0
    #: A campaign's steps, and the reads and watches that follow who leads.
    CAMPAIGN = 1


class Admission:
    """At most ``limit`` requests of one connection in flight; the others wait in their lane's queue."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.admitted = 0
        self._queues: dict[Lane, collections.deque[asyncio.Future[None]]] = {lane: collections.deque() for lane in Lane}

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    @contextlib.asynccontextmanager
    async def turn(self, lane: Lane | None) -> AsyncIterator[None]:
        """Admitted for the block (at once for ``lane=None``: such a request never queues)."""
        if lane is None:
            yield
            return
        await self._enter(lane)
        try:
            yield
        finally:
            self._leave()

    async def _enter(self, lane: Lane) -> None:
        if self.admitted < self.limit and not self.waiting:
            self.admitted += 1
            return
        queue = self._queues[lane]
        future = asyncio.get_running_loop().create_future()
        queue.append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self._leave()  # admitted, then cancelled before it could run: the turn goes to the next
            else:
                with contextlib.suppress(ValueError):  # a turn handed on may have dropped it already
                    queue.remove(future)
            raise

    def _leave(self) -> None:
        for lane in Lane:
            queue = self._queues[lane]
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)  # the turn passes on: as many admitted as before
                    return
        self.admitted -= 1
