"""The message-level adversary (soak/adversary/): its pieces on constructed inputs, and fixed seeds on real servers.

The seed runs start their own throwaway servers (the adversary restarts
them) and fail unless the run found no violation: two leaderships acting
at once beyond the margin, a token that does not grow, or a SQL leader
whose session was ended by nobody who meant it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import aioelect
from aioelect.backends.redis._options import RedisSettings
from soak.adversary import redis_target, stop_cmd
from soak.adversary.__main__ import describe
from soak.adversary.fenced import Grant, Write, run_fenced
from soak.adversary.fenced import judge as judge_fence
from soak.adversary.handovers import Seen, Step
from soak.adversary.handovers import judge as judge_handovers
from soak.adversary.network import Network, Profile
from soak.adversary.run import OPTIONS, Loss, _attach, deposed, run_seed, tokens
from soak.adversary.servers import SERVERS, EtcdTarget, MariaDBTarget, Target
from soak.adversary.shards import judge, run_shards
from soak.adversary.stops import Beats, read_beats, run_stops, stop_margin
from soak.adversary.stops import judge as judge_trees
from soak.checker import Act, Fault, Term
from tests.harness import MariaDBServer, MissingBinaryError, RedisServer
from tests.harness.plugin import server_unavailable, skip_if_external
from tests.harness.processes import popen

NS = 1_000_000_000
#: The CI seeds, per backend, and each one's seconds: about 6 minutes in all with the servers' starts. MySQL 3, 8
#: and 18 each find, on the library at 79d808b^ (scripts/adversary-old.sh mysql-kill), a kept session's old
#: connection id KILLed on the restarted server, ending the new leader's session (deposed), on every replay so far
#: (tests/test_adversary_old.py runs them there). etcd 1, 16 and 18 each found, on the library at 12e8962^
#: (scripts/adversary-old.sh etcd-late-read), a waiter's late read of the leader making a second leader (overlap);
#: the list found it again in 4 replays of 6 (docs/adversary.md, "Shown to find").
#: redis-sentinel 1 and 7 each find, on the library at e8940ad^ (scripts/adversary-old.sh redis-split), a master cut
#: off from its sentinels confirming the old leader's renews beside the promoted replica's leader (overlap).
#: redis-cluster 1 and 2 each cut the slot's master off from the cluster bus (about 35 s with the cluster's start).
SEEDS = {
    "etcd": [1, 16, 18],
    "mysql": [3, 8, 18],
    "postgres": [1],
    "redis": [1, 2],
    "redis-sentinel": [1, 7],
    "etcd-cluster": [1, 2],
    "redis-cluster": [1, 2],
}
#: The CI seeds of sharded leadership (Shards instances over 8 names), per backend. Seed 1 draws a harsh profile
#: (every request held back up to 2 s, a member key deleted every second): in 20 runs its instances took 2 to 20
#: leaderships, so one run alone is not enough to show the names were owned; seed 3 takes 21 to 33.
SHARD_SEEDS = {"etcd": [1, 3]}
#: Leaderships the shard seeds must take between them, per seed: the test judged names that were owned.
SHARD_LEADERSHIPS = 8
#: The CI seeds of stopped processes (``aioelect run`` supervisors, soak/adversary/stops.py), per backend. Each
#: found, on the library at f73605d^ (scripts/adversary-old.sh stopped-shim), a worker of a CMD that stopped its
#: shim still running after the next leader's CMD started (overlap), in every run so far (docs/adversary.md).
STOP_SEEDS = {"etcd": [1, 2]}
#: The CI seeds with the operator's step-downs (soak/adversary/handovers.py), per backend; each judges at least one.
HANDOVER_SEEDS = {"etcd": [2], "mysql": [1], "postgres": [4], "redis": [1]}
HANDOVER_SECONDS = 10.0
SECONDS = 12.0


def _term(who: str, token: int, start: float, end: float) -> Term:
    return Term(who, token, int(start * NS), int(end * NS), 10)


def test_tokens_accepts_an_old_leadership_seen_late_within_the_margin() -> None:
    assert tokens([_term("a", 5, 0.0, 3.0), _term("b", 4, 0.5, 1.0)], margin=1.0) == []


def test_tokens_reports_a_smaller_token_beyond_the_margin() -> None:
    found = tokens([_term("a", 5, 0.0, 3.0), _term("b", 4, 2.0, 4.0)], margin=1.0)
    assert [v.kind for v in found] == ["token"]
    assert "b's leadership (token 4)" in found[0].message


def _loss(start: float, at: float, reason: str = "the server closed the lock connection") -> Loss:
    return Loss("a", 7, int(start * NS), int(at * NS), reason)


def _fault(kind: str, start: float, heal: float | None = None) -> Fault:
    end = int((heal if heal is not None else start) * NS)
    return Fault(kind, "mysql", int(start * NS), end, end)


def test_deposed_reports_a_session_ended_by_nobody() -> None:
    found = deposed([_loss(1.0, 5.0)], [_fault("kill-holder", 0.5), _fault("restart", 2.0, 3.0)], window=1.0)
    assert [v.kind for v in found] == ["deposed"]


def test_deposed_accepts_a_session_ended_by_the_operator() -> None:
    assert deposed([_loss(1.0, 2.5)], [_fault("kill-holder", 2.0)], window=1.0) == []
    assert deposed([_loss(1.0, 2.5)], [_fault("restart", 2.0, 2.2)], window=1.0) == []
    assert deposed([_loss(1.0, 2.5)], [_fault("restart-reusing-ids", 2.0, 2.2)], window=1.0) == []
    # A leadership that began after the restart was over is not ended by it, nor by a restart that did not happen.
    assert len(deposed([_loss(3.0, 3.5)], [_fault("restart", 2.0, 2.2)], window=2.0)) == 1
    skipped = Fault("restart-reusing-ids", "mysql", 2 * NS, 2 * NS, 2 * NS, "no kept session")
    assert len(deposed([_loss(1.0, 2.5)], [skipped], window=1.0)) == 1


def test_deposed_accepts_a_leadership_granted_before_a_restart_and_seen_after_it() -> None:
    # Token 7 (see _loss) was granted before the server went down; its news was held back past the restart.
    restart = Fault("restart-reusing-ids", "mysql", int(2.0 * NS), int(2.2 * NS), int(2.2 * NS), granted_before=7)
    assert deposed([_loss(2.3, 2.3)], [restart], window=1.0) == []
    # The restarted server granted token 8 itself: nothing of the restart ended that session.
    newer = Fault("restart-reusing-ids", "mysql", int(2.0 * NS), int(2.2 * NS), int(2.2 * NS), granted_before=6)
    assert [v.kind for v in deposed([_loss(2.3, 2.3)], [newer], window=1.0)] == ["deposed"]
    unknown = Fault("restart", "mysql", int(2.0 * NS), int(2.2 * NS), int(2.2 * NS))
    assert [v.kind for v in deposed([_loss(2.3, 2.3)], [unknown], window=1.0)] == ["deposed"]


def test_deposed_accepts_a_leadership_seen_after_the_kill_that_ended_it() -> None:
    # The server granted the lock before the KILL; the replies saying so were held back past it.
    assert deposed([_loss(2.8, 3.0)], [_fault("kill-holder", 2.0, 2.1)], window=3.5) == []


def test_deposed_lets_one_kill_explain_one_loss() -> None:
    found = deposed([_loss(1.0, 2.5), _loss(1.2, 2.6)], [_fault("kill-holder", 2.0)], window=1.0)
    assert [v.at for v in found] == [int(2.6 * NS)]
    nobody = Fault("kill-holder", "mysql", int(2.0 * NS), int(2.0 * NS), int(2.0 * NS), "no holder")
    assert len(deposed([_loss(1.0, 2.5)], [nobody], window=1.0)) == 1


def test_deposed_ignores_losses_for_other_reasons() -> None:
    assert deposed([_loss(1.0, 5.0, "lock check did not complete within 0.6s")], [], window=1.0) == []


def _exchange(network: Network, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        return await network.exchange(what, send)

    return anyio.run(main)


def test_network_passes_replies_and_loses_some() -> None:
    async def send() -> str:
        return "reply"

    lossy = Network(random.Random(1), Profile(short_p=0, long_p=0, lost_reply_p=1.0), ConnectionResetError)
    with pytest.raises(ConnectionResetError):
        _exchange(lossy, "read leader", send)
    clean = Network(random.Random(1), Profile(short_p=0, long_p=0, lost_request_p=0, lost_reply_p=0), OSError)
    assert _exchange(clean, "read leader", send) == "reply"
    assert clean.counts == {}


def test_network_loses_every_exchange_of_an_elector_cut_off_and_none_after() -> None:
    sent: list[str] = []

    async def send() -> str:
        sent.append("sent")
        return "reply"

    network = Network(random.Random(1), Profile(short_p=0, long_p=0, lost_request_p=0, lost_reply_p=0), OSError)
    network.cut = True
    for what in ("read leader", "watch message", "lease keep-alive"):
        with pytest.raises(OSError):
            _exchange(network, what, send)
    assert sent == [] and network.counts["cut-off exchange"] == 3
    network.cut = False
    assert _exchange(network, "read leader", send) == "reply"


def test_network_cancels_a_watch_that_waits() -> None:
    async def never() -> str:
        await anyio.sleep(10)
        return "message"

    profile = Profile(short_p=0, long_p=0, cancel_watch_p=1.0, cancel_within=0.05)
    network = Network(random.Random(1), profile, OSError, cancelled=lambda: "cancelled")
    assert _exchange(network, "watch message", never) == "cancelled"
    assert network.counts["cancelled watch"] == 1


def test_profiles_aim_at_faults_that_meet_on_the_victim() -> None:
    etcd, mysql = SERVERS["etcd"], SERVERS["mysql"]
    late = [Profile.draw(random.Random(seed), etcd.kinds, views=etcd.views) for seed in range(200)]
    aimed = [p for p in late if p.victim_cancel_p is not None]
    assert 40 <= len(aimed) <= 120
    assert all(p.slow == etcd.views and ("timeout_p", 0.0) in p.victim_loop for p in aimed)
    # The late view's seeds hold the catching-up read until overtaken, and their operator reacts to it.
    assert all(p.react and p.overtake_p > 0 for p in aimed)
    assert not any(p.react or p.overtake_p for p in late if p.victim_cancel_p is None)
    kept = [Profile.draw(random.Random(seed), mysql.kinds, restarts=mysql.reuses_ids) for seed in range(200)]
    restarting = [p for p in kept if p.actions]
    assert 40 <= len(restarting) <= 120
    reuse = "restart-reusing-ids"
    assert all(dict(p.actions)[reuse] > 5 * sum(w for a, w in p.actions if a != reuse) for p in restarting)
    # A backend without views or reused ids gets no aimed profile.
    assert not any(Profile.draw(random.Random(seed)).actions for seed in range(50))


def test_network_cancels_the_victims_watches_at_its_own_rate() -> None:
    async def never() -> str:
        await anyio.sleep(10)
        return "message"

    profile = Profile(short_p=0, long_p=0, cancel_watch_p=0.0, victim_cancel_p=1.0, cancel_within=0.05)
    victim = Network(random.Random(1), profile, OSError, cancelled=lambda: "cancelled")
    victim.victim = True
    assert _exchange(victim, "watch message", never) == "cancelled"
    other = Network(random.Random(1), profile, OSError, cancelled=lambda: "cancelled")

    async def waits() -> bool:
        with anyio.move_on_after(0.2):  # not cancelled: it waits for the message
            await other.exchange("watch message", never)
            return False
        return True

    assert anyio.run(waits)
    assert other.counts["cancelled watch"] == 0


def test_network_holds_the_read_after_a_cancelled_watch_until_overtaken() -> None:
    """The victim's first read of a slow kind after the server cancelled its watch is handed back only after
    two later requests of its own (once armed), and no watch of it is cancelled meanwhile."""

    async def never() -> str:
        await anyio.sleep(10)
        return "message"

    async def reply() -> str:
        return "reply"

    profile = Profile(
        short_p=0,
        long_p=0,
        lost_request_p=0,
        lost_reply_p=0,
        cancel_watch_p=0.0,
        victim_cancel_p=1.0,
        cancel_within=0.05,
        slow=("read leader",),
        slow_p=1.0,
        long=5.0,
        overtake_p=1.0,
        overtake=(2, 2),
    )
    network = Network(random.Random(1), profile, OSError, cancelled=lambda: "cancelled")
    network.victim = True

    async def main() -> list[str]:
        seen: list[str] = []
        assert await network.exchange("watch message", never) == "cancelled"
        async with anyio.create_task_group() as tg:

            async def read() -> None:
                seen.append(await network.exchange("read leader", reply))

            tg.start_soon(read)
            await anyio.sleep(0.05)
            assert network.unclaimed
            network.claim()
            await network.exchange("campaign", reply)  # before the hold is armed: does not count
            network.arm()
            with anyio.move_on_after(0.2):  # no cancellation while the read is held
                await network.exchange("watch message", never)
            await network.exchange("lease keep-alive", reply)  # keep-alives do not count
            await network.exchange("check candidacy", reply)
            await anyio.sleep(0.05)
            seen.append("one later request")
            await network.exchange("campaign", reply)
            await network.unheld()
        return seen

    assert anyio.run(main) == ["one later request", "reply"]
    assert network.counts["overtaken reply"] == 1
    assert network.counts["cancelled watch"] == 1


@contextlib.contextmanager
def _server(backend: str, name: str) -> Iterator[Target]:
    """The backend's throwaway server for the adversary (a missing binary fails in CI, skips elsewhere)."""
    skip_if_external(SERVERS[backend].backend)
    target = SERVERS[backend](name)
    try:
        target.start()
    except MissingBinaryError as exc:
        target.cleanup()
        server_unavailable(str(exc))
    try:
        yield target
    finally:
        target.cleanup()


@pytest.mark.parametrize("backend", sorted(SEEDS))
def test_adversary_seeds_find_no_violation(backend: str) -> None:
    """The seeds, then on the same server the handover seeds: the operator also steps leaders down (to a
    candidate, to nobody, twice at once, while deposing the leader, to a successor that dies or is cut off), and
    no election may be stuck or a successor passed over silently."""
    failures = []
    judged = 0
    with _server(backend, f"adversary-ci-{backend}") as target:
        for seed in SEEDS[backend]:
            target.name = f"adversary-ci-{seed}"
            outcome = anyio.run(lambda: run_seed(target, seed, SECONDS))  # noqa: B023 - run at once
            if not outcome.ok:
                failures.append(describe(outcome, trace=10.0))
        for seed in HANDOVER_SEEDS.get(backend, []):
            target.name = f"adversary-ci-handovers-{seed}"
            outcome = anyio.run(lambda: run_seed(target, seed, HANDOVER_SECONDS, handovers=True))  # noqa: B023
            judged += outcome.counts.get("handover judged", 0)
            if not outcome.ok:
                failures.append(describe(outcome, trace=10.0))
    assert not failures, "\n".join(failures)
    assert judged >= 1 or backend not in HANDOVER_SEEDS, "no step-down was judged"


@pytest.mark.parametrize("backend", sorted(SHARD_SEEDS))
def test_adversary_shards_seeds_find_no_name_owned_twice(backend: str) -> None:
    """Shards instances over 8 names join, leave, crash and are partitioned under the adversary: per name, no
    two owners acting at once beyond the margin, and tokens growing."""
    failures = []
    taken: dict[int, int] = {}
    with _server(backend, f"adversary-ci-shards-{backend}") as target:
        for seed in SHARD_SEEDS[backend]:
            target.name = f"adversary-ci-shards-{seed}"
            outcome = anyio.run(lambda: run_shards(target, seed, SECONDS))  # noqa: B023 - run at once
            taken[seed] = outcome.counts.get("leadership", 0)
            if not outcome.ok:
                failures.append(describe(outcome, trace=10.0))
    assert not failures, "\n".join(failures)
    assert min(taken.values()) >= 1, f"a seed judged no leadership: {taken}"
    assert sum(taken.values()) >= SHARD_LEADERSHIPS * len(taken), f"too few leaderships judged: {taken}"


def _step(kind: str = "successor-dies", at: float = 1.0, taken_by: str | None = None) -> Step:
    return Step(kind, "e0", 5, int(at * NS), 2.0, taken_by=taken_by, victim="e1")


def _seen(at: float, who: str, kind: str, token: int | None = None, successor: str | None = None) -> Seen:
    return Seen(int(at * NS), who, kind, token, successor)


def test_handover_judge_reports_an_election_nobody_led_after_a_dead_successor() -> None:
    seen = [_seen(1.01, "e0", "handover_requested", 5, "e1")]
    found, _ = judge_handovers([_step()], seen, [], reopen=3.0, until=int(20 * NS))
    assert [v.kind for v in found] == ["stuck"]
    seen.append(_seen(5.5, "e2", "acquired", 6))
    warned = [(int(4.0 * NS), "handover from 'e0' not taken within 2s: the election opened to all candidates")]
    found, counts = judge_handovers([_step()], seen, warned, reopen=3.0, until=int(20 * NS))
    assert found == [] and counts["successor-dies judged"] == 1


def test_handover_judge_leaves_a_note_the_run_ended_on_unjudged() -> None:
    seen = [_seen(1.01, "e0", "handover_requested", 5, "e1")]
    found, counts = judge_handovers([_step()], seen, [], reopen=3.0, until=int(4 * NS))
    assert found == [] and counts == {"handover unjudged (the run ended)": 1}


def test_handover_judge_reports_a_successor_passed_over_without_a_warning() -> None:
    seen = [_seen(1.01, "e0", "handover_requested", 5, "e1"), _seen(1.2, "e2", "acquired", 6)]
    found, _ = judge_handovers([_step(taken_by="e2")], seen, [], reopen=3.0, until=int(20 * NS))
    assert [v.kind for v in found] == ["silent"]
    # The named successor took the note, then went: the next may lead at once.
    found, _ = judge_handovers([_step(taken_by="e1")], seen, [], reopen=3.0, until=int(20 * NS))
    assert found == []


def test_handover_judge_takes_the_next_leader_from_the_request_even_if_its_news_comes_before_the_notes() -> None:
    """The note's write reply held back: the successor's acquisition is seen before the note's own event."""
    seen = [
        _seen(1.5, "e2", "acquired", 6),
        _seen(2.5, "e0", "handover_requested", 5, "e1"),
        _seen(4, "e1", "acquired"),
    ]
    warned = [(int(1.4 * NS), "handover from 'e0' not taken within 2s: the election opened to all candidates")]
    found, counts = judge_handovers([_step(taken_by="e2")], seen, warned, reopen=3.0, until=int(20 * NS))
    assert found == [] and counts["handover passed over, with a WARNING"] == 1
    found, _ = judge_handovers([_step(taken_by="e2")], seen, [], reopen=3.0, until=int(20 * NS))
    assert [v.kind for v in found] == ["silent"] and found[0].message.startswith("e2 led")


def test_handover_judge_reports_one_leadership_stepping_down_twice() -> None:
    seen = [
        _seen(1.01, "e0", "handover_requested", 5, "e1"),
        _seen(1.02, "e0", "handover_requested", 5, "e2"),
        _seen(1.2, "e1", "acquired", 6),
    ]
    found, _ = judge_handovers([_step("step-down-twice")], seen, [], reopen=3.0, until=int(20 * NS))
    assert [v.kind for v in found] == ["twice"]


def test_deposed_counts_a_check_failed_by_the_server_not_one_failed_by_the_adversary() -> None:
    server = "lock connection failed: (2013) Lost connection to server during query"
    assert len(deposed([_loss(1.0, 5.0, server)], [], window=1.0)) == 1
    ours = "lock connection failed: ConnectionResetError('adversary: connection reset during e1')"
    assert deposed([_loss(1.0, 5.0, ours)], [], window=1.0) == []


def test_mariadb_restart_reusing_ids_hands_the_next_session_a_kept_id() -> None:
    """The operator's restart with ids reused: the next session gets the kept id (one already handed out again
    is left), and the operator waits until a session with it holds the lock."""
    skip_if_external("mysql")
    target = MariaDBTarget("adversary-reuse")
    try:
        target.start()
    except MissingBinaryError as exc:
        target.cleanup()
        server_unavailable(str(exc))
    server = target.server
    assert isinstance(server, MariaDBServer)
    try:
        import pymysql

        server.stop()
        detail = target._reuse([2, 40], random.Random(1))
        assert "the next session gets 40" in detail, detail
        session = pymysql.connect(host=server.host, port=server.port, user="root", autocommit=True)
        try:
            assert session.thread_id() == 40
            with session.cursor() as cur:
                cur.execute("SELECT GET_LOCK(%s, 0)", (target.name,))
            assert anyio.run(target.back, 0.1) is True
        finally:
            session.close()
        # Nobody holds the lock on a kept id: the pausing electors are not sent to campaign again.
        server.stop()
        target._reuse([60], random.Random(1))
        assert anyio.run(target.back, 0.1) is False
    finally:
        target.cleanup()


def test_adversary_script_kept_session_across_a_restart_ends_nobody_else() -> None:
    """The operator's actions in a fixed order, judged by the adversary's checker: A leads and releases (its
    session kept), the server restarts, B leads on the connection id A's session had, A campaigns again on
    its kept session. Nobody may end B's session."""
    skip_if_external("mysql")
    target = SERVERS["mysql"]("adversary-script")
    try:
        target.start()
    except MissingBinaryError as exc:
        target.cleanup()
        server_unavailable(str(exc))
    server = target.server
    assert isinstance(server, MariaDBServer)

    def connect() -> Any:
        import pymysql

        return pymysql.connect(host=server.host, port=server.port, user="root", password="")

    async def main() -> list[Any]:
        for _ in range(8):  # A's session gets an id that the restarted server hands out again below
            await anyio.to_thread.run_sync(lambda: connect().close())
        a, b = (aioelect.new(mysql=target.target(), name=target.name, identity=i, **OPTIONS["mysql"]) for i in "AB")
        fillers: list[Any] = []
        try:
            async with a, b:
                lead = await a.acquire()
                kept = int(server.query("SELECT IS_USED_LOCK(%s)", (target.name,), database="")[0][0])
                await lead.release()
                restarted = time.monotonic_ns()
                await anyio.to_thread.run_sync(server.restart)
                healed = time.monotonic_ns()
                while not fillers or fillers[-1].thread_id() < kept - 1:
                    fillers.append(await anyio.to_thread.run_sync(connect))
                other = await b.acquire()
                started = time.monotonic_ns()
                with anyio.move_on_after(3):
                    await a.acquire()  # a campaign on the kept session, which did not survive the restart
                await anyio.sleep(0.5)
                losses = [Loss("B", other.token, started, time.monotonic_ns(), other.lost_reason or "")]
                if not other.lost:
                    losses = []
                return deposed(losses, [Fault("restart", "mysql", restarted, healed, healed)], window=3.0)
        finally:
            for filler in fillers:
                filler.close()

    try:
        assert anyio.run(main) == []
    finally:
        target.cleanup()


#: The reads a waiter's leader watch makes: of the leader's key, or of the candidates ahead of its own key.
LEADER_READS = ("read leader", "read candidates ahead")


class _Script:
    """A scripted adversary for one etcd elector: cancel its watches, hold back its next read for the leader
    watch (:data:`LEADER_READS`), the campaign's next check until that read ran, and its next watch creation."""

    def __init__(self) -> None:
        self.cancels = 0
        self._tick = anyio.Event()
        self.hold_read = False
        self.read_ran = anyio.Event()
        self.deliver_read = anyio.Event()
        self.held = ""
        self.hold_watch = False
        self.create_watch = anyio.Event()

    def cancel_watches(self) -> None:
        """The server cancels every watch read now waiting."""
        self.cancels += 1
        tick, self._tick = self._tick, anyio.Event()
        tick.set()

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        if what == "watch message":
            start, result = self.cancels, []
            async with anyio.create_task_group() as tg:

                async def read() -> None:
                    result.append(await send())
                    tg.cancel_scope.cancel()

                async def cancelled() -> None:
                    while self.cancels == start:
                        await self._tick.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(read)
                tg.start_soon(cancelled)
            return result[0] if result else EtcdTarget("-").cancelled()
        if what == "watch created" and self.hold_watch:
            self.hold_watch = False
            await self.create_watch.wait()
        if what == "check candidacy" and self.hold_read:
            await self.read_ran.wait()
        if what in LEADER_READS and self.hold_read:
            self.hold_read = False
            self.held = what
            reply = await send()
            self.read_ran.set()
            await self.deliver_read.wait()
            return reply
        return await send()


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    with anyio.move_on_after(timeout):
        while not condition():
            await anyio.sleep(0.01)
        return True
    return False


def test_adversary_script_late_read_of_the_leader_makes_no_second_leader() -> None:
    """The adversary's faults in a fixed order on etcd, at the seam of W only: W waits third (P leads, Q next);
    W's leader watch is cancelled by the server and its read of the leader held back; P releases, Q leads, P
    campaigns again on its kept session; W's key is deleted by hand and put again behind P's new key; the
    held read lands, W's next watch request is late, and P gives up. W must not lead beside Q."""
    skip_if_external("etcd")
    target = SERVERS["etcd"]("adversary-late-read")
    try:
        target.start()
    except MissingBinaryError as exc:
        target.cleanup()
        server_unavailable(str(exc))
    assert isinstance(target, EtcdTarget)

    async def main() -> tuple[bool, bool]:
        p, q, w = (aioelect.new(etcd=target.target(), name=target.name, identity=i, **OPTIONS["etcd"]) for i in "PQW")
        script = _Script()
        _attach(w, script)
        leads: dict[str, Any] = {}

        async def campaign(elector: aioelect.Elector, key: str, timeout: float | None = None) -> None:
            with contextlib.suppress(TimeoutError):
                leads[key] = await elector.acquire(timeout=timeout)
                await anyio.sleep_forever()

        async with p, q, w, anyio.create_task_group() as tg:
            first = await p.acquire()
            tg.start_soon(campaign, q, "Q")
            await anyio.sleep(0.3)
            # W's leader watch may read as soon as W waits behind Q (it follows P from a read), or only when
            # its watch of P's key breaks: the first read it makes, either way, is the one held back.
            script.hold_read = True
            tg.start_soon(campaign, w, "W")
            backend: Any = w._backend
            leader: Any = p._backend
            p_key = target.name.encode() + b"/" + f"{leader.leases.current.lease_id:x}".encode()

            def behind_q() -> bool:
                view = backend.sight.current
                return view is not None and view.leader == p_key and view.predecessor not in (None, p_key)

            assert await _until(behind_q)
            for _ in range(10):  # the campaign's own watch may break first and read anew: try again
                if await _until(script.read_ran.is_set, 0.5):
                    break
                script.hold_read = True
                script.cancel_watches()
                await _until(behind_q)
            assert script.read_ran.is_set()
            await first.release()
            assert await _until(lambda: "Q" in leads)
            tg.start_soon(campaign, p, "P again", 3.0)
            await anyio.sleep(0.3)
            w_key = target.name + "/" + f"{backend.leases.current.lease_id:x}"
            await target._etcdctl("del", w_key)
            assert await _until(
                lambda: backend.sight.current is not None and backend.sight.current.predecessor == p_key
            )
            await anyio.sleep(0.5)
            script.hold_watch = True
            script.deliver_read.set()
            await _until(lambda: "W" in leads, 6.0)
            both = "W" in leads and leads["Q"].held and leads["W"].held
            script.create_watch.set()
            tg.cancel_scope.cancel()
            return "W" in leads, bool(both)

    try:
        _, both = anyio.run(main)
        assert not both, "W led beside Q"
    finally:
        target.cleanup()


def _acts(who: str, token: int, start: float, end: float) -> list[Act]:
    steps = int((end - start) / 0.05)
    return [
        Act(who, token, int((start + i * 0.05) * NS), int((start + i * 0.05) * NS) + 1000, True) for i in range(steps)
    ]


def test_shards_judge_checks_each_name_on_its_own() -> None:
    # Two instances each own a name at once: fine. On one name, two owners beyond the margin, and a token
    # that went back: both reported, for that name.
    acts = {
        "a": _acts("s0", 1, 0.0, 5.0) + _acts("s1", 2, 5.1, 8.0),
        "b": _acts("s1", 1, 0.0, 5.0) + _acts("s0", 3, 3.0, 8.0) + _acts("s1", 2, 9.0, 9.5),
    }
    found, terms = judge(acts, [], 0, int(10 * NS), 1.0, [], "test")
    assert sorted(v.kind for v in found) == ["overlap", "token"]
    assert all(v.message.startswith("name b: ") for v in found)
    assert len(terms) == 5


def test_redis_margin_is_the_renew_deadline_of_the_adversary_timing() -> None:
    assert redis_target.deposed_bound() == OPTIONS["redis"]["renew_deadline"]
    assert redis_target.deposed([Loss("a", 3, 0, int(2 * NS), "the lock key no longer holds our value")], [], 2.0)
    deleted = Fault("delete-key", "redis", int(1.5 * NS), int(1.5 * NS), int(1.5 * NS), "DEL k (held by a)")
    loss = Loss("a", 3, 0, int(2 * NS), "the lock key no longer holds our value (deleted, expired or changed)")
    assert redis_target.deposed([loss], [deleted], 2.0) == []
    assert redis_target.deposed([loss, loss], [deleted], 2.0) != []  # one deletion explains one loss


class _Renews:
    """Records every exchange's kind; holds back the renews (past check_timeout) while ``stall`` is set."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.stall = False

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        self.seen.add(what)
        if what == "renew" and self.stall:
            await anyio.sleep(10)  # the backend gives up after check_timeout
        return await send()


def test_redis_leader_whose_key_is_deleted_while_its_renews_fail_stops_by_its_renew_deadline(
    redis_server: RedisServer,
) -> None:
    """Every exchange of a Redis elector goes through its interceptor. A leader whose renews are held back
    while an operator deletes its key cannot tell that the key is gone: it goes on, beside the candidate that
    campaigns next and takes the key, until its renew deadline (not check_interval + 2 * check_timeout after
    the deletion), and then fences itself. So the adversary's margin for Redis is the renew deadline. (A
    candidate already waiting reads the key again only when it can have expired: nothing publishes a delete.)"""
    name = f"adversary-redis-script-{time.monotonic_ns()}"
    options = OPTIONS["redis"]

    async def main() -> tuple[float, str, set[str], set[str]]:
        seam_a, seam_b = _Renews(), _Renews()
        a = aioelect.new(redis=redis_server.url, name=name, identity="A", **options)
        b = aioelect.new(redis=redis_server.url, name=name, identity="B", **options)
        _attach(a, seam_a)  # type: ignore[arg-type]
        _attach(b, seam_b)  # type: ignore[arg-type]
        async with a, b, anyio.create_task_group() as tg:
            lead = await a.acquire()
            leads: list[aioelect.Leadership] = []
            done = anyio.Event()

            async def wait() -> None:  # a leadership lasts as long as the task that acquired it
                leads.append(await b.acquire(timeout=5))
                await done.wait()
                await leads[0].release()

            await anyio.sleep(options["check_interval"] * 2)  # a renew ran
            assert await a.leader() == "A"
            seam_a.stall = True
            key = RedisSettings.parse(redis_server.url, {"name": name, **options}).lock_key
            await anyio.to_thread.run_sync(lambda: redis_server.command("DEL", key))
            deleted = time.monotonic()
            tg.start_soon(wait)
            while lead.held:
                await anyio.sleep(0.01)
            stopped = time.monotonic() - deleted
            assert leads and leads[0].held  # B took the key the operator freed, A acted beside it meanwhile
            done.set()
            await lead.release()
        return stopped, lead.lost_reason or "", seam_a.seen, seam_b.seen

    stopped, reason, seen_a, seen_b = anyio.run(main)
    assert "renew deadline" in reason, reason
    assert stopped <= options["renew_deadline"] + 0.5, stopped
    assert {"acquire", "renew", "read leader", "subscribe", "read persistence"} <= seen_a, seen_a
    assert {"subscribe", "acquire", "release"} <= seen_b, seen_b


def _beats(who: str, token: int, role: str, start: float, end: float, pid: int = 100) -> Beats:
    return Beats(who, token, role, pid, 1, int(start * NS), int(end * NS), 10)


def _stop(who: str, start: float, heal: float, kind: str = "stop-supervisor") -> Fault:
    return Fault(kind, who, int(start * NS), int(heal * NS), int(heal * NS), "pid 1", who)


def test_stops_judge_reports_a_worker_of_the_earlier_tree_beyond_the_margin() -> None:
    beats = [
        _beats("s0", 5, "cmd", 0.0, 2.0),
        _beats("s0", 5, "setsid", 0.0, 9.0, pid=7),
        _beats("s1", 6, "cmd", 2.5, 9.0),
    ]
    found, terms, worst = judge_trees(beats, [], margin=2.5)
    assert [v.kind for v in found] == ["overlap"], found
    assert "s0's tree (token 5) worked for 6.50 s" in found[0].message and "setsid (pid 7)" in found[0].message
    assert [t.token for t in terms] == [5, 6] and worst == pytest.approx(6.5)
    # Within the margin, a handover; a stop of the later supervisor, or of the earlier one's shim, excuses nothing.
    assert judge_trees([_beats("s0", 5, "cmd", 0.0, 4.0), _beats("s1", 6, "cmd", 2.0, 9.0)], [], 2.5)[0] == []
    stops = [_stop("s1", 2.0, 8.0), _stop("s0", 2.0, 8.0, kind="stop-shim")]
    assert len(judge_trees(beats, stops, margin=2.5)[0]) == 1


def test_stops_judge_does_not_count_the_time_the_earlier_supervisor_was_stopped() -> None:
    # A stopped aioelect stops nothing (its lease runs out): its tree may work until the margin after it woke.
    beats = [_beats("s0", 5, "cmd", 0.0, 7.0), _beats("s1", 6, "cmd", 3.0, 9.0)]
    assert judge_trees(beats, [_stop("s0", 0.5, 5.0)], margin=2.5)[0] == []  # ended 2 s after it woke
    assert len(judge_trees(beats, [_stop("s0", 0.5, 2.0)], margin=2.5)[0]) == 1  # woke 5 s before its tree ended


def test_stops_judge_lets_a_tree_work_only_the_margin_after_its_stopped_supervisor_woke() -> None:
    # The time s0 was stopped and the margin after it woke are excused; the margin was then allowed once more on
    # top, so a tree could work on for twice the margin after its supervisor woke (here 2.4 s past wake + margin,
    # 4.9 s after the wake) and pass: a supervisor that, once woken, takes four times its grace and kill to end
    # its tree went unreported.
    beats = [_beats("s0", 5, "cmd", 0.0, 9.9), _beats("s1", 6, "cmd", 3.0, 12.0)]
    assert judge_trees(beats, [_stop("s0", 0.5, 5.0)], margin=2.5)[0] != [], "worked 2.4 s past wake + margin"
    ended = [_beats("s0", 5, "cmd", 0.0, 7.4), _beats("s1", 6, "cmd", 3.0, 12.0)]
    assert judge_trees(ended, [_stop("s0", 0.5, 5.0)], margin=2.5)[0] == []  # ended within the margin after it woke


def test_stops_judge_reports_a_later_tree_with_a_smaller_token() -> None:
    found, _, _ = judge_trees([_beats("s0", 5, "cmd", 0.0, 1.0), _beats("s1", 4, "cmd", 4.0, 5.0)], [], 2.5)
    assert [v.kind for v in found] == ["token"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", sorted(STOP_SEEDS))
def test_adversary_stops_seeds_find_no_tree_outliving_its_leadership(backend: str) -> None:
    """aioelect run --forever supervisors whose every process (the supervisor, the shim, CMD, a worker, a setsid
    worker) is stopped and continued, CMDs that stop their own shim, a leader deposed every few seconds: no tree
    works on after the next leader's CMD started (beyond the margin), nothing is left after SIGTERM."""
    failures = []
    with _server(backend, f"adversary-ci-stops-{backend}") as target:
        for seed in STOP_SEEDS[backend]:
            target.name = f"adversary-ci-stops-{seed}"
            outcome = anyio.run(lambda: run_stops(target, seed, SECONDS))  # noqa: B023 - run at once
            print(describe(outcome))
            assert outcome.counts.get("cmd stops its shim", 0) >= 1, outcome.counts
            assert outcome.counts.get("leadership", 0) >= 3, outcome.counts
            if not outcome.ok:
                failures.append(describe(outcome, trace=10.0))
    assert not failures, "\n".join(failures)


def _wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.timeout(120)
def test_a_stopped_supervisor_stops_nothing_its_cmd_works_on_beside_the_next_leaders(tmp_path: Path) -> None:
    """aioelect run stopped past the lease: the lease runs out and the next leader's CMD starts while the stopped
    supervisor's CMD works on (the fencing token is the protection there); once woken, it ends its tree. The
    stops checker reports that overlap, and counts it out when told the supervisor was stopped."""
    cmd = Path(stop_cmd.__file__)
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def trees() -> set[str]:
        return {b.who for b in read_beats(tmp_path)}

    with _server("etcd", "adversary-stopped-supervisor") as target:
        try:
            for who in ("s0", "s1"):
                argv = [sys.executable, "-m", "aioelect", "run", "--etcd", ",".join(target.target()), "--ttl", "3",
                        "--name", target.name, "--identity", who, "--grace", "0.5", "--", sys.executable, "-I", "-S",
                        str(cmd), str(tmp_path), "0", "worker", "cmd"]  # fmt: skip
                procs[who] = popen(argv, log_path=str(tmp_path / f"{who}.log"), env=dict(os.environ))
                assert _wait_for(lambda: "s0" in trees(), 30), "s0 never led"
            stopped = time.monotonic_ns()
            procs["s0"].send_signal(signal.SIGSTOP)
            try:
                assert _wait_for(lambda: "s1" in trees(), 30), "s1 never led"
                time.sleep(4.0)  # both trees work, longer than the margin
            finally:
                procs["s0"].send_signal(signal.SIGCONT)
            woken = time.monotonic_ns()
            procs["s0"].wait(30)  # woken, it sees the loss, ends its tree and exits
        finally:
            for proc in procs.values():
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
            for proc in procs.values():
                proc.wait(30)
    beats = read_beats(tmp_path)
    margin = stop_margin("etcd")
    found, _, worst = judge_trees(beats, [], margin)
    assert [v.kind for v in found] == ["overlap"], found
    assert "s0's tree" in found[0].message and worst > margin, found
    stop = Fault("stop-supervisor", "s0", stopped, woken, woken, "", "s0")
    assert judge_trees(beats, [stop], margin)[0] == [], "the time s0 was stopped, and the margin after, count"
    assert max(b.last for b in beats if b.who == "s0") < woken + int(margin * NS), "s0 ended its tree once woken"


#: The CI seeds of the fenced workload (soak/adversary/fenced.py), per backend, and each one's seconds: each seed
#: freezes its first leader past its lease with its write in flight.
FENCED_SEEDS = {"etcd": [15], "mysql": [15], "postgres": [15], "redis": [15]}
FENCED_SECONDS = 8.0


def _write(who: str, token: int, sent: float, replied: float, outcome: str = "accepted", key: str = "r/job/1") -> Write:
    return Write(who, token, key, token, int(sent * NS), int(replied * NS), outcome, in_flight=False)


def test_fence_judge_reports_a_write_accepted_after_a_newer_tokens_write_was_seen_accepted() -> None:
    newer = _write("b", 5, 1.0, 1.1)
    writes = [_write("a", 4, 0.5, 0.6), newer, _write("a", 4, 1.2, 1.3, key="r/cursor")]
    found, counts = judge_fence(writes, [], {"token": 4, "who": "a", "job": 4})
    assert [v.kind for v in found] == ["fence"]
    assert "a's write of r/cursor under token 4 accepted" in found[0].message
    assert (counts["fence late"], counts["fence late accepted"], counts["fence late refused"]) == (1, 1, 0)


def test_fence_judge_accepts_a_write_sent_before_the_newer_one_was_seen_and_counts_refusals() -> None:
    # Sent before b's write was seen accepted: the server may have ordered it first.
    concurrent = _write("a", 4, 1.05, 1.3)
    refused = _write("a", 4, 1.2, 1.25, outcome="refused")
    found, counts = judge_fence([_write("b", 5, 1.0, 1.1), concurrent, refused], [])
    assert found == []
    assert (counts["fence late"], counts["fence late refused"], counts["fence late accepted"]) == (1, 1, 0)


def test_fence_judge_reports_a_write_accepted_after_a_newer_token_was_granted() -> None:
    found, counts = judge_fence([_write("a", 4, 2.0, 2.1)], [Grant("b", 5, int(1.0 * NS))])
    assert [v.kind for v in found] == ["fence"]
    assert counts["fence stale accepted"] == 1 and counts["fence late"] == 0
    # A write found written after the run (its reply lost) counts as accepted.
    lost = Write("a", 4, "r/job/2", 2, int(2.0 * NS), int(2.1 * NS), "failed", in_flight=True, landed=True)
    assert [v.kind for v in judge_fence([lost], [Grant("b", 5, int(1.0 * NS))])[0]] == ["fence"]


def test_fence_judge_reports_a_cursor_left_under_an_older_token() -> None:
    writes = [_write("b", 5, 1.0, 1.1, key="r/cursor")]
    assert judge_fence(writes, [], {"token": 5, "who": "b", "job": 5})[0] == []
    assert [v.kind for v in judge_fence(writes, [], {"token": 4, "who": "a", "job": 4})[0]] == ["fence"]


@pytest.mark.parametrize("backend", sorted(FENCED_SEEDS))
def test_adversary_fenced_seeds_refuse_every_late_write(backend: str) -> None:
    """Leaders write fenced state under the adversary, the first one frozen past its lease with its write in
    flight: no write accepted under a token older than one seen granted or written, every such write refused."""
    failures = []
    with _server(backend, f"adversary-ci-fenced-{backend}") as target:
        for seed in FENCED_SEEDS[backend]:
            target.name = f"adversary-ci-fenced-{seed}"
            outcome = anyio.run(lambda: run_fenced(target, seed, FENCED_SECONDS))  # noqa: B023 - run at once
            counts = outcome.counts
            assert counts["fence frozen"] >= 1 and counts["fence in flight"] >= 1, describe(outcome)
            # The frozen leader's write went out after its successor was granted, and the server refused it.
            assert counts["fence stale"] >= 1 and counts["fence stale refused"] >= 1, describe(outcome)
            if not outcome.ok:
                failures.append(describe(outcome, trace=10.0))
    assert not failures, "\n".join(failures)


def test_adversary_fenced_workload_with_the_fence_off_finds_late_writes_accepted() -> None:
    """The same workload with every write unfenced (no token check, through the same store): the judge reports
    the frozen leader's write accepted after its successor's."""
    with _server("redis", "adversary-ci-unfenced") as target:
        target.name = "adversary-ci-unfenced-15"
        outcome = anyio.run(lambda: run_fenced(target, 15, FENCED_SECONDS, unfenced=True))
    assert outcome.counts["fence frozen"] >= 1, describe(outcome)
    assert "fence" in {v.kind for v in outcome.violations}, describe(outcome)
    assert outcome.counts["fence stale accepted"] >= 1, describe(outcome)
