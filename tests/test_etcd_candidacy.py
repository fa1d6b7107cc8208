"""The etcd campaign's state machine: real campaigns on a real etcd take only rows of its table.

Each scenario below drives one or more rows by their real cause (a release,
a key deleted by hand, a revoked lease, a cancelled wait, try_acquire behind
a leader, an etcd that never answers with degrade_to_local); every step
taken is recorded and must be a row of :data:`CANDIDACY_TRANSITIONS`.
"""

from __future__ import annotations

import asyncio
import socket

import anyio
import pytest

from aioelect import EtcdElector, Leadership
from aioelect.backends.etcd._candidacy import CANDIDACY_TRANSITIONS, Candidacy, Move, StepNotInTable, Tracker

from .harness import EtcdServer
from .test_etcd import ctl, eventually, keys, unique

pytestmark = pytest.mark.timeout(90)

#: Rows no scenario here drives for certain: a transient etcd failure while campaigning (the fault tests cause
#: those), a campaign cancelled before any session was granted, during a put or read, or while a won lease is
#: renewed, and a lease whose end the keep-alive notices before the watch on our key does, or while a won lease
#: is renewed.
NOT_WALKED = {
    (Candidacy.CANDIDATE, Move.RETRY),
    (Candidacy.WAITING, Move.RETRY),
    (Candidacy.NO_SESSION, Move.GIVE_UP),
    (Candidacy.CANDIDATE, Move.GIVE_UP),
    (Candidacy.WAITING, Move.SESSION_ENDED),
    (Candidacy.WON, Move.SESSION_ENDED),
    (Candidacy.WON, Move.GIVE_UP),
}


def test_a_step_off_the_table_raises_and_leaves_the_state() -> None:
    tracker = Tracker()
    with pytest.raises(StepNotInTable, match="'no older key' is not in the table from NO_SESSION"):
        tracker.move(Move.FIRST)
    assert tracker.state is Candidacy.NO_SESSION
    assert tracker.move(Move.SESSION) is Candidacy.CANDIDATE
    tracker.move(Move.FIRST)
    assert tracker.move(Move.DATED) is Candidacy.LEADING
    with pytest.raises(StepNotInTable):
        tracker.move(Move.GIVE_UP)  # a returned leadership is the Leadership's, not the campaign's
    assert tracker.state is Candidacy.LEADING


def test_every_unfinished_campaign_can_give_up_and_lose_its_session() -> None:
    """A campaign is cancelled wherever it stands, and a session ends under it wherever it has one: a row each."""
    rows = {(s, m): t for s, m, t in CANDIDACY_TRANSITIONS}
    for state in Candidacy:
        if state in CANDIDACY_TRANSITIONS.final:
            continue
        assert rows.get((state, Move.GIVE_UP)) is Candidacy.WITHDRAWN, state
        if state is not Candidacy.NO_SESSION:
            assert rows.get((state, Move.SESSION_ENDED)) is Candidacy.NO_SESSION, state


async def test_campaigns_take_only_rows_of_the_table(etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[tuple[Candidacy, Move, Candidacy | None]] = []
    move = Tracker.move

    def recording(self: Tracker, step: Move) -> Candidacy:
        before = self.state
        try:
            after = move(self, step)
        except StepNotInTable:
            taken.append((before, step, None))
            raise
        taken.append((before, step, after))
        return after

    monkeypatch.setattr(Tracker, "move", recording)
    name = unique()
    made = [EtcdElector(etcd.endpoints, name=name, identity=i, ttl=5) for i in "abcd"]
    a, b, c, d = made
    leads: dict[str, Leadership] = {}
    done = anyio.Event()

    async def lead(elector: EtcdElector) -> None:
        """Campaign, then hold the leadership in this task until the test is done."""
        leads[elector.identity] = held = await elector.acquire()
        await done.wait()
        await held.release()

    try:
        first = await a.acquire()  # NO_SESSION -> CANDIDATE -> WON -> LEADING
        async with anyio.create_task_group() as tg:
            tg.start_soon(lead, b)
            await eventually(lambda: _count(etcd, name, 2), 5, "b's key")
            assert await d.try_acquire() is None  # CANDIDATE -> WAITING -> WITHDRAWN
            await first.release()
            await eventually(lambda: "b" in leads, 10, "b leads")  # WAITING -> WON, or via CANDIDATE

            waiting_c = asyncio.get_running_loop().create_task(lead(c))
            await eventually(lambda: _count(etcd, name, 2), 5, "c's key")
            (c_key,) = [kv for kv in await keys(etcd, name) if kv["value"] == "c"]
            await ctl(etcd, "del", c_key["key"])  # our key deleted by hand: put again
            await eventually(lambda: _count(etcd, name, 2), 5, "c's key again")
            (c_key,) = [kv for kv in await keys(etcd, name) if kv["value"] == "c"]
            await ctl(etcd, "lease", "revoke", c_key["lease"])  # our lease ended: a new session
            await eventually(lambda: _lease_changed(etcd, name, c_key["lease"]), 10, "c's new lease")
            waiting_c.cancel()  # WAITING -> WITHDRAWN
            with pytest.raises(asyncio.CancelledError):
                await waiting_c
            done.set()

        port = _free_port()
        local = EtcdElector(f"127.0.0.1:{port}", name=name, degrade_to_local=True, connect_timeout=0.5, ttl=5)
        made.append(local)
        with anyio.fail_after(20):
            alone = await local.acquire()  # NO_SESSION -> LOCAL
        await alone.release()
    finally:
        for elector in made:
            await elector.aclose()

    rows = {(s, m): t for s, m, t in CANDIDACY_TRANSITIONS}
    for state, step, target in taken:
        assert target is not None, f"{state.name} --{step.value}--> is not a row"
        assert rows.get((state, step)) is target, f"{state.name} --{step.value}--> {target.name} is not a row"
    walked = {(s, m) for s, m, _ in taken}
    assert set(rows) - walked <= NOT_WALKED, f"rows not walked: {set(rows) - walked - NOT_WALKED}"


async def _count(server: EtcdServer, name: str, n: int) -> bool:
    return len(await keys(server, name)) == n


async def _lease_changed(server: EtcdServer, name: str, old: str) -> bool:
    mine = [kv for kv in await keys(server, name) if kv["value"] == "c"]
    return bool(mine) and mine[0]["lease"] != old


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
