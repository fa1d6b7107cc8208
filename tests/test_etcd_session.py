"""The shared etcd session (aioelect.EtcdSession) against a real etcd: one lease for many electors, fate sharing,
releases that leave the lease to the others, a close that leaves nothing behind."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import aioelect
from aioelect import ElectionError, EtcdElector, EtcdSession
from aioelect.backends.etcd._admission import LIMIT

from .harness import EtcdServer
from .test_etcd import TTL, ctl, delta, eventually, grpc_counts, keys, leases, unique

pytestmark = pytest.mark.timeout(60)


def test_options_belong_to_the_session() -> None:
    """Connection and lease options go to the session, the election's name to the elector; mixing them is refused."""
    with pytest.raises(TypeError, match="name"):
        EtcdSession("127.0.0.1:2379", name="/x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="degrade_to_local"):
        EtcdSession("127.0.0.1:2379", degrade_to_local=True)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="renew_deadline"):
        EtcdSession("127.0.0.1:2379", ttl=3, renew_deadline=5)
    session = EtcdSession("127.0.0.1:2379", ttl=3)
    with pytest.raises(TypeError, match="ttl"):
        EtcdElector(session=session, name="/x", ttl=3)
    with pytest.raises(TypeError, match="one or the other"):
        EtcdElector("127.0.0.1:2379", session=session, name="/x")
    with pytest.raises(TypeError, match="endpoints"):
        EtcdElector(name="/x")
    with pytest.raises(ValueError, match="printable"):
        EtcdElector(session=session, name="bad name")
    assert len(session) == 0
    EtcdElector(session=session, name="/x")
    with pytest.raises(ValueError, match="already campaigns on '/x'"):
        EtcdElector(session=session, name="/x")
    assert len(session) == 1
    assert aioelect.EtcdSession is EtcdSession


async def test_a_session_must_be_entered_before_campaigning(etcd: EtcdServer) -> None:
    session = EtcdSession(etcd.endpoints, ttl=TTL)
    elector = EtcdElector(session=session, name=unique())
    with pytest.raises(ElectionError, match="enter the EtcdSession"):
        await elector.acquire()
    await session.aclose()
    with pytest.raises(ValueError, match="closed"):
        EtcdElector(session=session, name=unique())


async def test_electors_share_one_lease_and_release_leaves_it(
    fresh_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Three elections, one lease; a release deletes one key, an elector's close leaves the lease; the session's
    close revokes it."""
    names = [unique() for _ in range(3)]
    caplog.set_level(logging.WARNING, logger="aioelect")
    async with EtcdSession(fresh_etcd.endpoints, ttl=TTL) as session:
        lease = session.lease_id
        assert lease is not None
        electors = [EtcdElector(session=session, name=n, identity=f"id-{i}") for i, n in enumerate(names)]
        leads = [await e.acquire() for e in electors]
        assert await leases(fresh_etcd) == [f"{lease:x}"]
        for name, identity in zip(names, ["id-0", "id-1", "id-2"], strict=True):
            (kv,) = await keys(fresh_etcd, name)
            assert kv == {**kv, "key": f"{name}/{lease:x}", "value": identity, "lease": f"{lease:x}"}
        await leads[0].release()
        assert await keys(fresh_etcd, names[0]) == []
        assert await leases(fresh_etcd) == [f"{lease:x}"]
        await electors[1].aclose()
        assert await keys(fresh_etcd, names[1]) == []
        assert len(session) == 2
        await asyncio.sleep(TTL)  # keep-alives go on for the others
        assert leads[2].held and session.lease_id == lease
        again = await electors[0].acquire()  # the same lease
        assert (await keys(fresh_etcd, names[0]))[0]["lease"] == f"{lease:x}"
        assert again.token is not None and leads[0].token is not None and again.token > leads[0].token
    assert not again.held and not leads[2].held
    assert await leases(fresh_etcd) == []
    for name in names:
        assert await keys(fresh_etcd, name) == []
    await asyncio.sleep(0)  # tasks cancelled at close have run their last step
    left = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("aioelect")]
    assert left == [], left


async def test_a_lost_lease_ends_every_leadership_then_a_new_one_is_shared(fresh_etcd: EtcdServer) -> None:
    """Fate sharing: revoking the shared lease ends all leaderships; the next campaigns share a new lease."""
    async with EtcdSession(fresh_etcd.endpoints, ttl=TTL) as session:
        first = session.lease_id
        assert first is not None
        electors = [EtcdElector(session=session, name=unique()) for _ in range(3)]
        leads = [await e.acquire() for e in electors]
        await ctl(fresh_etcd, "lease", "revoke", f"{first:x}")
        await eventually(lambda: not any(lead.held for lead in leads), 3 * TTL, "every leadership lost")
        assert all(lead.lost_reason for lead in leads)
        for lead in leads:
            await lead.release()
        with anyio.fail_after(10):
            again = [await e.acquire() for e in electors]
        second = session.lease_id
        assert second is not None and second != first
        assert await leases(fresh_etcd) == [f"{second:x}"]
        assert all(lead.held for lead in again)
    assert await leases(fresh_etcd) == []


async def test_closing_the_session_closes_its_electors(fresh_etcd: EtcdServer) -> None:
    """A leader and a campaign still waiting: the session's close releases one, cancels the other, leaves nothing."""
    name = unique()
    async with EtcdElector(fresh_etcd.endpoints, name=name, identity="outside", ttl=TTL) as outside:
        blocker = await outside.acquire()
        session = EtcdSession(fresh_etcd.endpoints, ttl=TTL)
        await session.__aenter__()
        leader = EtcdElector(session=session, name=unique())
        waiter = EtcdElector(session=session, name=name)
        lead = await leader.acquire()
        outcome: list[BaseException] = []

        async def wait() -> None:
            try:
                await waiter.acquire()
            except ElectionError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await eventually(
                lambda: _count_keys(fresh_etcd, name, 2), 5, "the session's candidate key next to the leader's"
            )
            with anyio.fail_after(10):
                await session.aclose()
        assert outcome and "closed" in str(outcome[0])
        assert not lead.held and len(session) == 0
        assert [kv["value"] for kv in await keys(fresh_etcd, name)] == ["outside"]
        assert blocker.held
        await blocker.release()
    assert await leases(fresh_etcd) == []


async def _count_keys(server: EtcdServer, name: str, n: int) -> bool:
    return len(await keys(server, name)) == n


async def test_a_cancelled_campaign_withdraws_its_key_and_keeps_the_lease(fresh_etcd: EtcdServer) -> None:
    name = unique()
    async with EtcdElector(fresh_etcd.endpoints, name=name, identity="outside", ttl=TTL) as outside:
        blocker = await outside.acquire()
        async with EtcdSession(fresh_etcd.endpoints, ttl=TTL) as session:
            other = EtcdElector(session=session, name=unique())
            held = await other.acquire()
            waiter = EtcdElector(session=session, name=name)
            with anyio.move_on_after(0.5):
                await waiter.acquire()
            assert [kv["value"] for kv in await keys(fresh_etcd, name)] == ["outside"]
            assert held.held and session.lease_id is not None
            assert f"{session.lease_id:x}" in await leases(fresh_etcd)
        await blocker.release()
    assert await leases(fresh_etcd) == []


async def test_many_electors_cost_one_lease_and_one_keepalive_per_interval(fresh_etcd: EtcdServer) -> None:
    """20 elections on one session: one LeaseGrant, keep-alives for the session, not per elector (every ttl/12:
    the session holds leaderships)."""
    before = await grpc_counts(fresh_etcd)
    async with EtcdSession(fresh_etcd.endpoints, ttl=3) as session:
        electors = [EtcdElector(session=session, name=unique()) for _ in range(20)]
        leads = [await e.acquire() for e in electors]
        await asyncio.sleep(3.2)  # three keep-alive intervals
        assert all(lead.held for lead in leads)
        after = await grpc_counts(fresh_etcd)
    changes = delta(before, after)
    assert changes.get("started:LeaseGrant", 0) == 1, changes
    assert changes.get("started:LeaseKeepAlive", 0) == 1, changes  # one stream
    assert 8 <= changes.get("received:LeaseKeepAlive", 0) <= 16, changes  # ~4/s, not ~80/s
    assert await leases(fresh_etcd) == []


class _InFlight:
    """An interceptor that counts a connection's campaign requests and watch creations in flight at once."""

    #: The exchanges of a campaign, of a leadership, and of a follower of the leader (not the lease's, not a release's).
    QUEUED = frozenset({"campaign", "check candidacy", "proclaim", "read candidates ahead", "read leader", "read key"})

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.keepalives = 0

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        if what == "lease keep-alive":
            self.keepalives += 1
        if what not in self.QUEUED and what != "watch created":
            return await send()
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await send()
        finally:
            self.now -= 1


async def test_campaigns_started_at_once_keep_a_bounded_number_of_requests_in_flight(etcd: EtcdServer) -> None:
    """Two sessions start 150 campaigns each at once in the same 150 elections: on each connection at most
    LIMIT campaign requests and watch creations are in flight at a time, every election gets one leader, and
    every leadership stays confirmed by the session's keep-alives (which never wait behind the campaigns)."""
    names = [unique() for _ in range(150)]
    counts = [_InFlight(), _InFlight()]
    leads: dict[tuple[int, str], aioelect.Leadership] = {}

    async def campaign(i: int, elector: EtcdElector) -> None:
        leads[i, elector.name] = await elector.acquire()
        await asyncio.Event().wait()

    async with EtcdSession(etcd.endpoints, ttl=5) as a, EtcdSession(etcd.endpoints, ttl=5) as b:
        tasks = []
        for i, (session, count) in enumerate(zip((a, b), counts, strict=True)):
            session.conn.interceptor = count
            electors = [EtcdElector(session=session, name=name, identity=f"s{i}") for name in names]
            tasks += [asyncio.create_task(campaign(i, e)) for e in electors]
        try:
            await eventually(lambda: sum(lead.held for lead in leads.values()) == len(names), 30, "150 leaders")
            await asyncio.sleep(2 * 5 / 3)  # two keep-alive intervals
            assert sum(lead.held for lead in leads.values()) == len(names)
            assert {name for (_, name), lead in leads.items() if lead.held} == set(names)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert [count.most for count in counts] == [LIMIT, LIMIT], "queued, never more than LIMIT at once"
    assert all(count.keepalives >= 2 for count in counts)
