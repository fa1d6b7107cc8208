"""An etcd campaign cancelled at any moment takes only rows of its table and leaves no key behind."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from aioelect import EtcdElector
from aioelect.backends.etcd._candidacy import Candidacy, Move, StepNotInTable, Tracker
from aioelect.backends.etcd._session import Session

from .harness import EtcdServer
from .test_etcd import eventually, keys, unique

pytestmark = pytest.mark.timeout(120)

#: Cancel after this many seconds: before the session, during the put, the read, the wait, the renewal.
DELAYS = [0.0, 0.001, 0.002, 0.004, 0.006, 0.01, 0.015, 0.02, 0.03, 0.05, 0.08]


async def test_cancelled_campaigns_take_only_rows_and_leave_no_key(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    off_table: list[tuple[Candidacy, Move]] = []
    move = Tracker.move

    def recording(self: Tracker, step: Move) -> Candidacy:
        try:
            return move(self, step)
        except StepNotInTable:
            off_table.append((self.state, step))
            raise

    monkeypatch.setattr(Tracker, "move", recording)
    name = unique()
    leader = EtcdElector(etcd.endpoints, name=name, identity="leader", ttl=5)
    errors: list[BaseException] = []
    try:
        for behind in (False, True):
            lead = await leader.acquire() if behind else None
            for delay in DELAYS:
                for once in (False, True):
                    elector = EtcdElector(etcd.endpoints, name=name, identity=f"c-{delay}-{once}", ttl=5)
                    try:
                        call = elector.try_acquire() if once else elector.acquire()
                        task = asyncio.get_running_loop().create_task(call)
                        await asyncio.sleep(delay)
                        task.cancel()
                        try:
                            got = await task
                        except asyncio.CancelledError:
                            got = None
                        except Exception as exc:  # an AssertionError here is a campaign off its table
                            errors.append(exc)
                            got = None
                        if got is not None:
                            await got.release()
                    finally:
                        await elector.aclose()
            if lead is not None:
                await lead.release()
            await eventually(lambda: _count(etcd, name, 0), 10, "no candidate key left")
    finally:
        await leader.aclose()
    assert off_table == []
    assert [e for e in errors if isinstance(e, AssertionError)] == [], errors


async def _count(etcd: EtcdServer, name: str, expected: int) -> bool:
    return len(await keys(etcd, name)) == expected


async def test_campaign_whose_session_ends_while_won_campaigns_on(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A win found with a stale lease is renewed first; a lease revoked meanwhile sends the campaign on (WON ->
    NO_SESSION), and it still wins: no step off the table reaches the caller."""
    name = unique()
    elector = EtcdElector(etcd.endpoints, name=name, identity="w", ttl=3)
    backend = elector._backend
    monkeypatch.setattr(type(backend), "_stale", lambda self, session: True)
    revoked: list[int] = []
    keepalive = Session.keepalive

    async def revoking(session_self: Session) -> float:
        lease = session_self.lease_id
        if not revoked:  # the first win's lease only
            revoked.append(lease)
            await anyio.to_thread.run_sync(lambda: etcd.etcdctl("lease", "revoke", f"{lease:x}", timeout=10))
        return await keepalive(session_self)

    monkeypatch.setattr(Session, "keepalive", revoking)
    taken: list[tuple[Candidacy, Move]] = []
    move = Tracker.move

    def recording(self: Tracker, step: Move) -> Candidacy:
        taken.append((self.state, step))
        return move(self, step)

    monkeypatch.setattr(Tracker, "move", recording)
    try:
        with anyio.fail_after(30):
            lead = await elector.acquire()
        assert lead.held
        assert (Candidacy.WON, Move.SESSION_ENDED) in taken, taken
        await lead.release()
    finally:
        await elector.aclose()
