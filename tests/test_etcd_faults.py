"""Process and server faults with the etcd backend: killed candidates, revoked leases, frozen,
restarted or partitioned etcd, a lost cluster member.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from aioelect import EtcdElector, LossKind
from aioelect.backends.etcd._backend import EtcdBackend
from aioelect.core._elector import backend_of

from .backends import Follower
from .faults import Candidates, check_invariants
from .harness import EtcdCluster, EtcdServer, TCPProxy
from .test_etcd import ctl, eventually, keys, leases, unique

pytestmark = pytest.mark.timeout(90)

log = logging.getLogger("aioelect.test")


@pytest.fixture
async def closing() -> AsyncIterator[list[EtcdElector]]:
    """Electors appended here are closed after the test."""
    made: list[EtcdElector] = []
    yield made
    for elector in made:
        await elector.aclose()


def make(made: list[EtcdElector], endpoints: list[str], name: str, identity: str, **options: object) -> EtcdElector:
    elector = EtcdElector(endpoints, name=name, identity=identity, **options)  # type: ignore[arg-type]
    made.append(elector)
    return elector


# --- a candidate process dies ----------------------------------------------------------------

PROCESS_TTL = 2


@pytest.fixture
def candidates(fresh_etcd: EtcdServer) -> Iterator[Candidates]:
    with Candidates("etcd", fresh_etcd.endpoint, unique(), {"ttl": PROCESS_TTL}) as group:
        yield group


def test_killed_leader_process_is_replaced_after_its_ttl(candidates: Candidates) -> None:
    for i in range(3):
        candidates.start(f"cand-{i}")
    leader = candidates.wait_leader(timeout=30)
    successor, took = candidates.replace(leader, leader.kill, timeout=PROCESS_TTL + 10)
    log.warning("etcd takeover after SIGKILL of the leader process: %.2fs (ttl=%ss)", took, PROCESS_TTL)
    assert successor is not leader
    # Its lease expires between 2/3 ttl and ttl after the last keep-alive; the lessor checks every 0.5 s.
    assert PROCESS_TTL / 3 < took < PROCESS_TTL + 2.0, f"takeover took {took:.2f}s"
    check_invariants(candidates, max_gap=PROCESS_TTL + 2.0)


def test_frozen_leader_process_is_replaced_and_acts_no_more(candidates: Candidates) -> None:
    for i in range(3):
        candidates.start(f"cand-{i}")
    leader = candidates.wait_leader(timeout=30)
    successor, took = candidates.replace(leader, leader.freeze, timeout=PROCESS_TTL + 10)
    print(f"MEASURED etcd sigstop takeover {took:.3f}s (ttl {PROCESS_TTL}s)")
    assert took < PROCESS_TTL + 2.0, f"takeover of a frozen leader took {took:.2f}s"
    time.sleep(0.5)
    stale = candidates.stale_acts_after_thaw(leader, successor)
    assert not stale, f"the frozen leader acted {len(stale)} times after waking"
    check_invariants(candidates, max_gap=PROCESS_TTL + 2.0)


def test_partitioned_leader_stops_and_is_replaced(candidates: Candidates, fresh_etcd: EtcdServer) -> None:
    with TCPProxy(fresh_etcd.host, fresh_etcd.port) as proxy:
        leader = candidates.start("partitioned", target=proxy.endpoint)
        assert candidates.wait_leader(timeout=30) is leader
        for i in range(2):
            candidates.start(f"direct-{i}")
        time.sleep(0.5)
        stopped, successor, took = candidates.cut_off(leader, proxy, timeout=PROCESS_TTL + 10)
        print(f"MEASURED etcd partition: leader stops {stopped:.3f}s, takeover {took:.3f}s (ttl {PROCESS_TTL}s)")
        assert successor is not leader
        assert stopped < PROCESS_TTL, "a cut-off leader must fence itself before its lease can expire"
        assert took < PROCESS_TTL + 2.0
        proxy.heal()
        check_invariants(candidates, max_gap=PROCESS_TTL + 2.0)


# --- leadership taken away from outside -------------------------------------------------------


async def test_lease_revoked_from_outside_is_lost_at_once(etcd: EtcdServer, closing: list[EtcdElector]) -> None:
    name = unique()
    elector = make(closing, etcd.endpoints, name, "leader", ttl=3)
    lead = await elector.acquire()
    (kv,) = await keys(etcd, name)
    revoked = time.monotonic()
    await ctl(etcd, "lease", "revoke", kv["lease"])
    with anyio.fail_after(3):
        await lead.wait_lost()
    took = time.monotonic() - revoked
    log.warning("etcd loss detection after lease revoke: %.3fs", took)
    assert took < 1.0
    assert not lead.held and "revoked or expired" in (lead.lost_reason or "")
    assert lead.lost_kind is LossKind.EXPIRED
    await lead.release()
    assert await keys(etcd, name) == []


async def test_key_deleted_from_outside_is_lost_at_once(etcd: EtcdServer, closing: list[EtcdElector]) -> None:
    name = unique()
    elector = make(closing, etcd.endpoints, name, "leader", ttl=3)
    lead = await elector.acquire()
    (kv,) = await keys(etcd, name)
    deleted = time.monotonic()
    await ctl(etcd, "del", kv["key"])
    with anyio.fail_after(3):
        await lead.wait_lost()
    assert time.monotonic() - deleted < 1.0
    assert "leader key deleted" in (lead.lost_reason or "")
    assert lead.lost_kind is LossKind.DEPOSED
    await lead.release()
    assert kv["lease"] not in await leases(etcd), "the lease of a lost leadership is revoked"
    # The elector campaigns again afterwards.
    again = await elector.acquire()
    assert again.held
    await again.release()


# --- the server freezes, restarts, or is partitioned away ------------------------------------------


async def test_frozen_etcd_leader_fences_itself_within_renew_deadline(
    fresh_etcd: EtcdServer, closing: list[EtcdElector]
) -> None:
    name = unique()
    elector = make(closing, fresh_etcd.endpoints, name, "leader", ttl=3, connect_timeout=1)
    lead = await elector.acquire()
    await asyncio.sleep(1.2)  # a few keep-alives
    assert lead.held
    frozen = time.monotonic()
    fresh_etcd.freeze()
    try:
        with anyio.fail_after(elector.renew_deadline + 2):
            await lead.wait_lost()
        took = time.monotonic() - frozen
        log.warning(
            "etcd frozen: leader fenced itself after %.3fs (renew_deadline=%.3gs, ttl=3s)", took, elector.renew_deadline
        )
        # The last acknowledged keep-alive was sent before the freeze, so the deadline falls before frozen + deadline.
        assert took <= elector.renew_deadline + 0.3
        assert not lead.held
        await asyncio.sleep(3.5 - took)  # longer than the TTL
    finally:
        fresh_etcd.thaw()
    await lead.release()
    with anyio.fail_after(15):
        again = await elector.acquire()
    assert again.held and isinstance(again.token, int) and isinstance(lead.token, int) and again.token > lead.token
    await again.release()
    await eventually(lambda: _no_keys(fresh_etcd, name), 10, "no keys left")


async def _no_keys(server: EtcdServer, name: str) -> bool:
    return await keys(server, name) == []


async def test_observe_resynchronises_after_etcd_restart(fresh_etcd: EtcdServer, closing: list[EtcdElector]) -> None:
    name = unique()
    endpoints = fresh_etcd.endpoints
    a = make(closing, endpoints, name, "cand-a", ttl=5, connect_timeout=1)
    b = make(closing, endpoints, name, "cand-b", ttl=5, connect_timeout=1)
    watcher = make(closing, endpoints, name, "watcher", connect_timeout=1)
    seen: list[str | None] = []

    async def watch() -> None:
        async for leader in watcher.observe():
            seen.append(leader)

    observing = asyncio.create_task(watch())
    try:
        # Nobody leads yet: seen first, or a's campaign may win the race with the watcher's first read.
        await eventually(lambda: seen[-1:] == [None], 5, "the watcher to see nobody leading before a campaigns")
        lead_a = await a.acquire()
        await eventually(lambda: seen[-1:] == ["cand-a"], 5, "the watcher to see cand-a")
        await anyio.to_thread.run_sync(fresh_etcd.restart)
        follower = Follower(b)
        await lead_a.release()
        await follower.wait(timeout=15)
        await eventually(lambda: seen[-1:] == ["cand-b"], 10, "the watcher to see cand-b after the restart")
        await follower.close()
        await eventually(lambda: seen[-1:] == [None], 10, "the watcher to see nobody leading")
        assert not observing.done(), "observe must not end on a reconnect"
        assert seen[0] is None and "cand-a" in seen
    finally:
        observing.cancel()
        await asyncio.gather(observing, return_exceptions=True)


async def test_session_expiring_while_campaigning_behind_a_stalled_link(
    fresh_etcd: EtcdServer, closing: list[EtcdElector]
) -> None:
    """A follower cut off longer than its TTL campaigns again with a new session (etcd issue 19597)."""
    name = unique()
    ttl = 2
    with TCPProxy(fresh_etcd.host, fresh_etcd.port) as proxy:
        a = make(closing, fresh_etcd.endpoints, name, "cand-a", ttl=ttl, connect_timeout=1)
        b = make(closing, [proxy.endpoint], name, "cand-b", ttl=ttl, connect_timeout=1, degrade_to_local=False)
        lead_a = await a.acquire()
        follower = Follower(b)
        await eventually(lambda: _has(fresh_etcd, name, "cand-b"), 5, "b's candidate key")
        (b_old,) = [kv for kv in await keys(fresh_etcd, name) if kv["value"] == "cand-b"]
        proxy.stall()
        await eventually(lambda: _lease_gone(fresh_etcd, b_old["lease"]), ttl + 3, "b's lease to expire")
        assert not follower.won.is_set()
        proxy.heal()
        await eventually(lambda: _has(fresh_etcd, name, "cand-b"), 10, "b campaigning again")
        assert lead_a.held and not follower.won.is_set()
        await lead_a.release()
        lead_b = await follower.wait()
        (kv,) = await keys(fresh_etcd, name)
        assert kv["value"] == "cand-b" and kv["lease"] != b_old["lease"] and kv["lease"] in await leases(fresh_etcd)
        assert lead_b.token == kv["create_revision"]
        await follower.close()


class Census:
    """Candidates each in ``run()`` (campaigning again after every loss); counts who leads every 10 ms."""

    def __init__(self, electors: list[EtcdElector]) -> None:
        self.electors = electors
        self.most = 0
        self.losses: list[str] = []
        for elector in electors:
            elector.add_listener(lambda event: self.losses.append(str(event.reason)) if event.kind == "lost" else None)
        self._tasks = [asyncio.create_task(elector.run(anyio.sleep_forever)) for elector in electors]
        self._sampler = asyncio.create_task(self._sample())

    def leaders(self) -> list[str]:
        return [e.identity for e in self.electors if e.leading]

    async def _sample(self) -> None:
        while True:
            self.most = max(self.most, len(self.leaders()))
            await asyncio.sleep(0.01)

    async def one_leader_for(self, seconds: float) -> None:
        """Every sample over ``seconds`` shows exactly one leader, always the same."""
        first = self.leaders()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            now = self.leaders()
            assert len(now) == 1 and now == first, f"leaders {now}, then {first}"
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        for task in (*self._tasks, self._sampler):
            task.cancel()
        await asyncio.gather(*self._tasks, self._sampler, return_exceptions=True)


@pytest.mark.parametrize("degrade", [None, True], ids=["default", "degrade-opted-in"])
async def test_cut_off_leader_never_leads_locally_one_leader_after_heal(
    fresh_etcd: EtcdServer, closing: list[EtcdElector], degrade: bool | None
) -> None:
    """A leader cut off from etcd loses, campaigns again and stays a follower: it reached etcd before, so it
    never leads locally, even opted in to degrading; after the partition heals there is exactly one leader."""
    name = unique()
    ttl = 2
    options: dict[str, object] = {"ttl": ttl, "connect_timeout": 1}
    if degrade is not None:
        options["degrade_to_local"] = degrade
    with TCPProxy(fresh_etcd.host, fresh_etcd.port) as proxy:
        cut = make(closing, [proxy.endpoint], name, "cut-off", **options)
        direct = make(closing, fresh_etcd.endpoints, name, "direct", **options)
        census = Census([cut])
        try:
            await eventually(lambda: census.leaders() == ["cut-off"], 5, "the proxied candidate to lead")
            census.electors.append(direct)
            census._tasks.append(asyncio.create_task(direct.run(anyio.sleep_forever)))
            await asyncio.sleep(0.5)
            assert census.leaders() == ["cut-off"]
            proxy.stall()
            await eventually(lambda: census.leaders() == ["direct"], ttl + 5, "the direct candidate to take over")
            await asyncio.sleep(ttl + 1.0)  # the cut-off one fails lease grants meanwhile
            assert census.leaders() == ["direct"], "the cut-off candidate leads locally"
            proxy.heal()
            await census.one_leader_for(3.0)
            assert census.most == 1, "two leaders at once"
            assert any("renew deadline" in r or "session ended" in r for r in census.losses), census.losses
        finally:
            await census.close()


async def test_degraded_leader_steps_down_when_etcd_answers_one_leader_after_heal(
    fresh_etcd: EtcdServer, closing: list[EtcdElector], caplog: pytest.LogCaptureFixture
) -> None:
    """Opted in and cut off from its first request, a candidate leads locally beside etcd's leader (what the
    option gives up); once the partition heals its local leadership is lost and run() campaigns on etcd."""
    caplog.set_level(logging.WARNING, logger="aioelect")
    name = unique()
    with TCPProxy(fresh_etcd.host, fresh_etcd.port) as proxy:
        proxy.drop()
        cut = make(closing, [proxy.endpoint], name, "degraded", ttl=2, connect_timeout=1, degrade_to_local=True)
        direct = make(closing, fresh_etcd.endpoints, name, "direct", ttl=2, connect_timeout=1, degrade_to_local=True)
        census = Census([direct, cut])
        try:
            await eventually(lambda: len(census.leaders()) == 2, 10, "both to lead (one locally)")
            assert any("WITHOUT mutual exclusion" in r.getMessage() for r in caplog.records)
            healed = time.monotonic()
            proxy.heal()
            await eventually(lambda: census.leaders() == ["direct"], 5, "the degraded leader to step down")
            log.warning("degraded leadership ended %.3fs after etcd answered again", time.monotonic() - healed)
            assert any("etcd answered" in reason for reason in census.losses), census.losses
            await census.one_leader_for(3.0)
            assert await cut.leader() == "direct", "the former degraded leader now sees etcd's leader"
        finally:
            await census.close()


async def _has(server: EtcdServer, name: str, value: str) -> bool:
    return any(kv["value"] == value for kv in await keys(server, name))


async def _lease_gone(server: EtcdServer, lease: str) -> bool:
    return lease not in await leases(server)


async def test_cluster_member_killed_election_goes_on(etcd_cluster: EtcdCluster, closing: list[EtcdElector]) -> None:
    raft_leader = etcd_cluster.leader()
    assert raft_leader is not None
    victim = next(m for m in etcd_cluster.members if m is not raft_leader)
    # The victim first, so that every elector is connected to it when it dies.
    endpoints = [victim.endpoint] + [m.endpoint for m in etcd_cluster.members if m is not victim]
    name = unique()
    a = make(closing, endpoints, name, "cand-a", ttl=3)
    b = make(closing, endpoints, name, "cand-b", ttl=3)
    lead_a = await a.acquire()
    follower = Follower(b)
    await asyncio.sleep(0.3)
    await anyio.to_thread.run_sync(victim.kill)
    await asyncio.sleep(3.5)  # longer than the TTL: keep-alives must have moved to another member
    assert lead_a.held, f"leadership lost after one member died: {lead_a.lost_reason}"
    assert not follower.won.is_set()
    assert await b.leader() == "cand-a"
    released = time.monotonic()
    await lead_a.release()
    lead_b = await follower.wait()
    assert time.monotonic() - released < 1.0
    assert lead_b.held and await a.leader() == "cand-b"
    await follower.close()


#: Rounds of concurrent candidacy checks, each cancelled 0 to 3 ms after it was sent.
CHECK_ROUNDS = 300


async def test_candidacy_checks_cancelled_mid_flight_leave_etcd_running(fresh_etcd: EtcdServer) -> None:
    """A campaign's read cancelled while etcd serves it (a timeout, a task cancelled) must not take the server
    down: etcd 3.5.0 to 3.5.4 panics when the client of a read-only transaction goes away while it is applied
    (etcd-io/etcd#14110), so a campaign never sends one. The waiting candidate's check (is our key still
    standing, and which key is before it) is cancelled at every moment of its flight, 20 at a time."""
    name = unique()
    leader = EtcdElector(fresh_etcd.endpoints, name=name, identity="leader", ttl=5)
    waiting = EtcdElector(fresh_etcd.endpoints, name=name, identity="waiting", ttl=5)
    try:
        lead = await leader.acquire()
        backend = backend_of(waiting)
        assert isinstance(backend, EtcdBackend)
        session = await backend.leases.live()
        key = backend.prefix + f"{session.lease_id:x}".encode()
        revision, predecessor, _ = await backend._put_candidate(session, key, b"waiting")
        assert predecessor is not None and (await backend._check(session, key, revision))[0] == predecessor

        async def check_cancelled_after(delay: float) -> None:
            with anyio.move_on_after(delay):
                await backend._check(session, key, revision)

        rounds = 0
        while rounds < CHECK_ROUNDS and fresh_etcd.running:
            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(check_cancelled_after, 0.003 * ((rounds + i) % 7) / 7)
            rounds += 1
        assert fresh_etcd.running, f"etcd {fresh_etcd.binary_version} died after {rounds} rounds of checks"
        assert (await backend._check(session, key, revision))[0] == predecessor
        await lead.release()
    finally:
        await waiting.aclose()
        await leader.aclose()
