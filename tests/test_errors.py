"""Errors a caller can tell apart: the subclasses of ElectionError, and the kind of a loss (memory backend)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import pytest

import aioelect
from aioelect import (
    ElectionError,
    ElectorClosed,
    LeadershipLost,
    LossKind,
    PermanentBackendError,
    UsageError,
    current_leadership,
    leadership,
)
from aioelect.core._backend import ErrorTable
from aioelect.core._elector import backend_of
from aioelect.testing import MemoryElector

pytestmark = pytest.mark.timeout(30)


def test_every_error_is_an_election_error() -> None:
    for error in (UsageError, ElectorClosed, PermanentBackendError, LeadershipLost, aioelect.BackendUnavailable):
        assert issubclass(error, ElectionError)
    assert not issubclass(UsageError, ElectorClosed) and not issubclass(ElectorClosed, UsageError)
    lost = LeadershipLost("gone", LossKind.EXPIRED)
    assert lost.reason == "gone" and lost.kind is LossKind.EXPIRED and str(lost) == "leadership lost: gone"


async def test_misuse_and_a_closed_elector_raise_their_own_errors() -> None:
    with pytest.raises(UsageError, match="outside leader work"):
        current_leadership()
    elector = MemoryElector(name="errors-misuse")
    lead = await elector.acquire()
    with pytest.raises(UsageError, match="leading"):
        await elector.acquire()
    with pytest.raises(UsageError, match="idle"):
        elector.identity = "other"
    await lead.release()
    await elector.aclose()
    with pytest.raises(ElectorClosed, match="closed"):
        await elector.acquire()


async def test_closing_while_campaigning_raises_elector_closed() -> None:
    async with MemoryElector(name="errors-closing") as leader:
        lead = await leader.acquire()
        waiter = MemoryElector(name="errors-closing")
        task = asyncio.get_running_loop().create_task(waiter.acquire())
        await asyncio.sleep(0.05)
        await waiter.aclose()
        with anyio.fail_after(5), pytest.raises(ElectorClosed, match="while campaigning"):
            await task
        await lead.release()


async def test_a_deposed_leader_loses_with_kind_deposed() -> None:
    async with MemoryElector(name="errors-deposed") as elector:
        with pytest.raises(LeadershipLost) as info:
            async with leadership(elector) as lead:
                elector.depose("taken by the test")
                await asyncio.sleep(5)
        assert info.value.kind is LossKind.DEPOSED and info.value.reason == "taken by the test"
        assert lead.lost_kind is LossKind.DEPOSED


async def test_a_stalled_leader_fences_itself_with_kind_self_fenced() -> None:
    async with MemoryElector(name="errors-stalled", renew_deadline=0.3) as elector:
        lead = await elector.acquire()
        assert lead.lost_kind is None
        elector.stall()
        await anyio.sleep(0.35)
        assert lead.lost_kind is LossKind.SELF_FENCED
        with pytest.raises(LeadershipLost) as info:
            lead.check()
        assert info.value.kind is LossKind.SELF_FENCED
        with anyio.fail_after(5):
            await lead.wait_lost()
        assert lead.lost_kind is LossKind.SELF_FENCED and "renew deadline" in (lead.lost_reason or "")
        await lead.release()


async def test_check_after_our_own_release_has_no_kind() -> None:
    async with MemoryElector(name="errors-released") as elector:
        lead = await elector.acquire()
        await lead.release()
        with pytest.raises(LeadershipLost) as info:
            lead.check()
        assert info.value.kind is None and lead.lost_kind is None


def _tables() -> dict[str, ErrorTable]:
    """Each server backend's error table, as its elector holds it (constructing an elector connects nowhere)."""
    mysql = backend_of(aioelect.MySQLElector("mysql://u:s3cr3tpw@127.0.0.1:1/db", name="t"))
    postgres = backend_of(aioelect.PostgresElector("postgresql://u:s3cr3tpw@127.0.0.1:1/db", name="t"))
    redis = backend_of(aioelect.RedisElector("redis://127.0.0.1:1/0", name="t"))
    etcd = backend_of(aioelect.EtcdElector(endpoints=["127.0.0.1:1"], name="t"))
    tables: dict[str, ErrorTable] = {"mysql": mysql, "postgres": postgres, "redis": redis, "etcd": etcd.conn}  # type: ignore[attr-defined]
    return tables


@pytest.mark.parametrize("backend", ["mysql", "postgres", "redis", "etcd"])
def test_every_server_backend_sorts_errors_in_one_shape(backend: str) -> None:
    table = _tables()[backend]
    assert isinstance(table, ErrorTable)
    # A timeout or a cut connection: retried by a campaign, BackendUnavailable for a single attempt.
    for transient in (TimeoutError(), ConnectionResetError("reset by peer")):
        assert not table.permanent(transient)
        assert isinstance(table.failure(transient, "the campaign"), aioelect.BackendUnavailable)
    # The backend's own refusal, already worded: permanent, raised as it is.
    refusal = PermanentBackendError("the server's setting refuses it")
    assert table.permanent(refusal)
    assert table.failure(refusal, "the campaign") is refusal


@pytest.mark.parametrize("backend", ["mysql", "postgres", "redis"])
def test_a_refused_login_is_permanent_and_named_on_every_driver(backend: str) -> None:
    import asyncpg
    import pymysql
    import redis.exceptions

    refused: Exception = {
        "mysql": pymysql.err.OperationalError(1045, "Access denied for user 'u'@'localhost' (using password: YES)"),
        "postgres": asyncpg.InvalidPasswordError('password authentication failed for user "u"'),
        "redis": redis.exceptions.AuthenticationError("WRONGPASS invalid username-password pair"),
    }[backend]
    table = _tables()[backend]
    assert table.permanent(refused)
    error = table.failure(refused, "the campaign")
    assert isinstance(error, PermanentBackendError)
    assert "s3cr3tpw" not in str(error)


def test_a_backend_with_no_server_has_nothing_to_intercept(tmp_path: Path) -> None:
    for elector in (aioelect.FileElector(tmp_path / "lock", name="t"), MemoryElector(name="t")):
        with pytest.raises(UsageError, match="no server"):
            backend_of(elector).intercept(None)
