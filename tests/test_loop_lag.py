"""The loop-lag timer's registry forgets an event loop that was closed while a leadership was held in it.

A loop closed without running its tasks to their end (``loop.close()`` after ``run_until_complete``, a thread's
own loop) never ends its leaderships: the registry drops closed loops when the next leadership starts, so that
no closed loop, its timer or what they reach stays for the life of the process.
"""

from __future__ import annotations

import asyncio
import threading

from aioelect.core._elector import _LoopLag
from aioelect.testing import MemoryElector

from .backends import unique_name


def test_a_closed_loop_is_not_kept_by_the_lag_registry() -> None:
    kept: list[object] = []

    def in_thread() -> None:
        async def lead() -> None:
            elector = MemoryElector(name=unique_name())
            await elector.__aenter__()
            found = await elector.acquire()
            assert found._lag is not None
            kept.append(elector)

        loop = asyncio.new_event_loop()
        loop.run_until_complete(lead())
        loop.close()  # the leadership's keeper never ran to its end

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()

    async def another() -> None:  # the next leadership anywhere, in a loop of its own
        async with MemoryElector(name=unique_name()) as elector:
            lead = await elector.acquire()
            await lead.release()

    asyncio.run(another())
    assert not [loop for loop in _LoopLag._of if loop.is_closed()], "a closed loop is still in the registry"
