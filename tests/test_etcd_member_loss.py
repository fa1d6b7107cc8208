"""A waiting etcd candidate goes on campaigning after a cluster member dies, whichever member it is.

One three-member cluster, many rounds: in each, A leads and B waits, each
connected first to a chosen member (the endpoint listed first), then one
member is SIGKILLed: the one both are connected to, B's, A's, or etcd's raft
leader. After the lease TTL and the connect timeout, and a few seconds of
slack for a loaded machine, either A still leads and the surviving members
hold B's key (B campaigns), or B leads. Then the member is started again.
``AIOELECT_MEMBER_LOSS_ROUNDS`` sets the number of rounds (12).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelect import EtcdElector, Leadership

from .harness import EtcdCluster, EtcdServer
from .test_etcd import eventually, keys, unique

pytestmark = pytest.mark.timeout(600)

log = logging.getLogger("aioelect.test")

TTL = 3
CONNECT_TIMEOUT = 2.0
#: For a loaded machine (two cores shared with other test runs): the survivors elect a raft leader (1-3 s), whose
#: lessor restarts every lease's TTL when it takes over: a fenced leader's key can stand that much longer.
SLACK = 7.0
ROUNDS = int(os.environ.get("AIOELECT_MEMBER_LOSS_ROUNDS", "12"))
#: Who is connected to the member that dies, round after round.
CASES = ("both", "b", "a", "raft leader")


class Waiter:
    """Campaigns in its own task and keeps what it won, or the error that ended its campaign."""

    def __init__(self, elector: EtcdElector) -> None:
        self.lead: Leadership | None = None
        self.error: BaseException | None = None
        self.won_at: float | None = None
        self.task = asyncio.create_task(self._run(elector))

    async def _run(self, elector: EtcdElector) -> None:
        try:
            self.lead = await elector.acquire()
            self.won_at = time.monotonic()
        except Exception as exc:
            self.error = exc
            log.error("B's campaign ended: %r", exc)
            return
        await asyncio.sleep(3600)

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        if self.lead is not None:
            with anyio.move_on_after(5):
                await self.lead.release()


@pytest.fixture
async def closing() -> AsyncIterator[list[EtcdElector]]:
    made: list[EtcdElector] = []
    yield made
    for elector in made:
        with anyio.move_on_after(10):
            await elector.aclose()


async def _values(server: EtcdServer, name: str) -> list[str] | None:
    """The values of the election's keys on ``server`` (None: it could not answer now)."""
    try:
        with anyio.fail_after(4):
            return [kv["value"] for kv in await keys(server, name)]
    except (AssertionError, TimeoutError):
        return None


async def _b_takes_over(lead_a: Leadership, waiter: Waiter, failures: list[str], where: str) -> bool:
    """A releases (if it still leads): B, campaigning, must lead within the connect timeout and the slack."""
    await lead_a.release()
    released = time.monotonic()
    while waiter.lead is None and waiter.error is None and time.monotonic() - released < CONNECT_TIMEOUT + SLACK:
        await asyncio.sleep(0.05)
    if waiter.lead is not None and waiter.lead.held:
        return True
    failures.append(f"{where}: B did not lead after A released: B lead={waiter.lead}, B error={waiter.error!r}")
    return False


def _order(first: EtcdServer, members: list[EtcdServer]) -> list[str]:
    return [first.endpoint] + [m.endpoint for m in members if m is not first]


async def test_waiting_candidate_campaigns_on_after_any_member_dies(
    etcd_cluster: EtcdCluster, closing: list[EtcdElector], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG, logger="aioelect")
    members = etcd_cluster.members
    failures: list[str] = []
    took: list[float] = []
    b_won: list[str] = []  # rounds where A lost its leadership (the raft leader died) and B took over
    for round_ in range(ROUNDS):
        case = CASES[round_ % len(CASES)]
        raft_leader = await anyio.to_thread.run_sync(etcd_cluster.leader)
        assert raft_leader is not None, "the cluster has no raft leader before the round"
        if case == "raft leader":
            victim = raft_leader
            others = [m for m in members if m is not victim]
            a_first, b_first = others[round_ % 2], others[(round_ + 1) % 2]
        else:
            victim = members[round_ % len(members)]
            other = members[(round_ + 1) % len(members)]
            a_first = victim if case in ("both", "a") else other
            b_first = victim if case in ("both", "b") else other
        survivor = next(m for m in members if m is not victim)
        name = unique()
        options = {"ttl": TTL, "connect_timeout": CONNECT_TIMEOUT}
        a = EtcdElector(_order(a_first, members), name=name, identity="cand-a", **options)  # type: ignore[arg-type]
        b = EtcdElector(_order(b_first, members), name=name, identity="cand-b", **options)  # type: ignore[arg-type]
        closing.extend([a, b])
        with anyio.fail_after(15):
            lead_a = await a.acquire()
        waiter = Waiter(b)
        try:
            with anyio.fail_after(15):
                while sorted(await _values(survivor, name) or []) != ["cand-a", "cand-b"]:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(random.uniform(0.0, 1.0))  # at any phase of the keep-alives and the watch
            caplog.clear()
            killed = time.monotonic()
            await anyio.to_thread.run_sync(victim.kill)
            log.warning("round %d: killed %s (%s)", round_, victim.name, case)
            # B's old key may still stand until its lease would have expired: judge only after that.
            await asyncio.sleep(TTL + 0.5)
            deadline = killed + TTL + CONNECT_TIMEOUT + SLACK
            ok = False
            while True:
                values = await _values(survivor, name)
                b_leads = waiter.lead is not None and waiter.lead.held
                a_leads_b_waits = lead_a.held and values is not None and "cand-b" in values
                if (b_leads or a_leads_b_waits) and waiter.error is None:
                    if b_leads and waiter.won_at is not None:
                        b_won.append(f"{case}: {waiter.won_at - killed:.2f}s")
                    took.append(time.monotonic() - killed)
                    ok = await _b_takes_over(lead_a, waiter, failures, f"round {round_} ({case}, killed {victim.name})")
                    break
                if time.monotonic() > deadline:
                    failures.append(
                        f"round {round_} ({case}, killed {victim.name}): A held={lead_a.held}, "
                        f"B lead={waiter.lead}, B error={waiter.error!r}, keys on {survivor.name}: {values}"
                    )
                    break
                await asyncio.sleep(0.1)
            if not ok:
                path = tmp_path / f"round{round_}.log"
                lines = (f"{r.created:.3f} {r.name} {r.levelname} {r.getMessage()}" for r in caplog.records)
                await anyio.Path(path).write_text("\n".join(lines))
                log.error("%s; DEBUG log of the round in %s", failures[-1], path)
        finally:
            await waiter.close()
            with anyio.move_on_after(5):
                await lead_a.release()
            for elector in (a, b):
                with anyio.move_on_after(10):
                    await elector.aclose()
            await anyio.to_thread.run_sync(victim.start)
    log.warning("rounds: %d, failed: %d, judged after (s): %s", ROUNDS, len(failures), [round(t, 2) for t in took])
    log.warning("B led after A lost, seconds after the kill: %s", b_won)
    assert not failures, "\n".join(failures)


class _StallKeepAlives:
    """Holds back every lease keep-alive of one connection while ``stalled`` (a link that stalls one way)."""

    def __init__(self) -> None:
        self.stalled = False
        self.healed = asyncio.Event()

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        if what == "lease keep-alive" and self.stalled:
            await self.healed.wait()
        return await send()


async def test_win_on_a_lease_past_its_renew_deadline_is_renewed_before_leading(
    etcd: EtcdServer, closing: list[EtcdElector]
) -> None:
    """B's keep-alives stall past its renew deadline (not its TTL) while it waits; A then resigns. B must not
    be handed a leadership already past its renew deadline (lost as it is returned, the campaign over): it
    renews its lease first, and leads once etcd acknowledges it."""
    name = unique()
    ttl = 6  # renew deadline 4 s, keep-alive every 2 s: B's lease outlives a 4.5 s stall by 1.5 s
    a = EtcdElector(etcd.endpoints, name=name, identity="cand-a", ttl=ttl)
    b = EtcdElector(etcd.endpoints, name=name, identity="cand-b", ttl=ttl)
    closing.extend([a, b])
    stall = _StallKeepAlives()
    b._backend.conn.interceptor = stall  # type: ignore[attr-defined]
    lead_a = await a.acquire()
    waiter = Waiter(b)
    try:
        await eventually(lambda: b.last_leader == "cand-a", 10, "B to wait behind A")
        session = b._backend.leases.current  # type: ignore[attr-defined]
        stall.stalled = True
        deadline = b._backend.renew_deadline  # type: ignore[attr-defined]
        await eventually(lambda: time.monotonic() - session.confirmed_at > deadline + 0.2, 10, "B's lease stale")
        await lead_a.release()
        await asyncio.sleep(0.3)  # B has seen A's key go
        stall.stalled = False
        stall.healed.set()
        await eventually(lambda: waiter.lead is not None or waiter.error is not None, 10, "B's campaign to end")
        assert waiter.error is None, repr(waiter.error)
        assert waiter.lead is not None
        await asyncio.sleep(0.5)
        assert waiter.lead.held, f"B's leadership lost as it began: {waiter.lead.lost_reason}"
        assert await a.leader() == "cand-b"
    finally:
        await waiter.close()
