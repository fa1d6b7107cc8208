"""A leader change on etcd costs O(1) reads in all, not one per waiting candidate, however the candidates arrived.

Counted with etcd's own ``etcd_debugging_mvcc_range_total`` (every range read the server's store serves, inside
transactions too) around one resign with many candidates waiting: candidates that arrived one after another, and
candidates whose campaigns all started at the same moment.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from typing import Any

import anyio
import pytest

from aioelect import EtcdElector
from aioelect.backends.etcd._backend import EtcdBackend
from aioelect.backends.etcd._candidacy import Candidacy

from .harness import EtcdServer
from .test_etcd import TTL, unique

pytestmark = pytest.mark.timeout(60)

WAITERS = 8
#: Followers whose campaigns start together in one ``asyncio.gather``.
TOGETHER = 11
ROUNDS = 4


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


def waiting_in_line(elector: EtcdElector) -> bool:
    """Whether ``elector``'s campaign has its key and waits for its predecessor, having seen who leads."""
    backend = elector._backend
    assert isinstance(backend, EtcdBackend)
    return backend.candidacy.state is Candidacy.WAITING and elector.last_leader is not None


async def test_a_resign_costs_a_few_reads_when_the_candidates_started_together(etcd: EtcdServer) -> None:
    # Whether campaigns started together step on each other depends on how etcd interleaves them: a few elections.
    counts = [await _resign_after_starting_together(etcd) for _ in range(ROUNDS)]
    # The new leader's own campaign may read once; no other waiter reads (there are TOGETHER - 1 of them).
    assert max(counts) <= 2, f"range reads for one leader change with {TOGETHER} candidates started together: {counts}"


async def _resign_after_starting_together(etcd: EtcdServer) -> float:
    """The range reads in the second after the leader resigns, its TOGETHER followers having started together."""
    name = unique()
    electors = [EtcdElector(etcd.endpoints, name=name, identity=f"cand-{i}", ttl=TTL) for i in range(TOGETHER + 1)]
    leaders: list[str] = []

    async def follow(elector: EtcdElector) -> None:
        await elector.acquire()
        leaders.append(elector.identity)
        await asyncio.sleep(60)

    together: asyncio.Future[Any] | None = None
    try:
        lead = await electors[0].acquire()
        # Every follower's campaign starts in the same turn of the loop: their requests reach etcd together.
        together = asyncio.gather(*(follow(e) for e in electors[1:]))
        with anyio.fail_after(20):
            while not all(waiting_in_line(e) for e in electors[1:]):
                await asyncio.sleep(0.01)
        await asyncio.sleep(1.0)  # every campaign and watch set up, quiet
        assert all(e.last_leader == "cand-0" for e in electors[1:]), [e.last_leader for e in electors[1:]]
        before = await range_total(etcd)
        await lead.release()
        with anyio.fail_after(10):
            while not leaders:
                await asyncio.sleep(0.01)
        await asyncio.sleep(1.0)  # reads that would follow late
        reads = await range_total(etcd) - before
        assert [e.identity for e in electors[1:] if e.leading] == leaders, leaders
        assert all(e.last_leader == leaders[0] for e in electors[1:]), [e.last_leader for e in electors[1:]]
        assert not together.done()
        return reads
    finally:
        if together is not None:
            together.cancel()
            await asyncio.gather(together, return_exceptions=True)
        for elector in electors:
            await elector.aclose()
