"""A leader change on etcd costs O(1) reads in all, not one per waiting candidate.

Counted with etcd's own ``etcd_debugging_mvcc_range_total`` (every range read the server's store serves, inside
transactions too) around one resign with many candidates waiting.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request

import anyio
import pytest

from aioelect import EtcdElector

from .harness import EtcdServer
from .test_etcd import TTL, unique

pytestmark = pytest.mark.timeout(60)

WAITERS = 8


async def range_total(server: EtcdServer) -> float:
    def read() -> float:
        with urllib.request.urlopen(server.metrics_url, timeout=5) as reply:
            text = reply.read().decode()
        found = re.search(r"^etcd_debugging_mvcc_range_total (\S+)$", text, re.M)
        assert found, "etcd_debugging_mvcc_range_total missing from /metrics"
        return float(found.group(1))

    return await anyio.to_thread.run_sync(read)


async def hold(elector: EtcdElector) -> None:
    await elector.acquire()
    await asyncio.sleep(60)


async def test_a_resign_costs_a_few_reads_however_many_candidates_wait(etcd: EtcdServer) -> None:
    name = unique()
    electors = [EtcdElector(etcd.endpoints, name=name, identity=f"cand-{i}", ttl=TTL) for i in range(WAITERS + 1)]
    try:
        lead = await electors[0].acquire()
        waiting = []
        for elector in electors[1:]:  # in order: cand-1 is next
            waiting.append(asyncio.create_task(hold(elector)))
            with anyio.fail_after(10):
                while elector.last_leader != "cand-0":
                    await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # every campaign and watch set up, quiet
        before = await range_total(etcd)
        await lead.release()
        for _ in range(1000):
            if electors[1].leading and all(e.last_leader == "cand-1" for e in electors[2:]):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"followers saw {[e.last_leader for e in electors[1:]]}; {electors[1]}")
        await asyncio.sleep(0.5)  # reads that would follow late
        reads = await range_total(etcd) - before
        # The new leader's own campaign may read once; no other waiter reads (there are 7 of them).
        assert reads <= 2, f"{reads:g} range reads for one leader change with {WAITERS} candidates waiting"
        assert all(not t.done() for t in waiting) and not any(e.leading for e in electors[2:])
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for elector in electors:
            await elector.aclose()
