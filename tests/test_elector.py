"""The backend-independent contract, on the local backend, plus the factory."""

from __future__ import annotations

import asyncio
import logging

import anyio
import pytest

import aioelect
from aioelect import ElectionError, LeadershipLost, LocalElector, leadership


async def test_acquire_returns_held_leadership() -> None:
    async with LocalElector(identity="solo") as elector:
        lead = await elector.acquire()
        assert lead.held and not lead.lost
        assert lead.identity == "solo"
        assert lead.token is not None
        assert await elector.leader() == "solo"
        await lead.release()
        assert not lead.held and not lead.lost
        assert await elector.leader() is None


async def test_tokens_increase_within_a_process() -> None:
    async with LocalElector(name="tokens-test") as elector:
        tokens = []
        for _ in range(3):
            lead = await elector.acquire()
            tokens.append(lead.token)
            await lead.release()
        assert tokens == sorted(tokens) and len(set(tokens)) == 3


async def test_acquire_twice_raises() -> None:
    async with LocalElector() as elector:
        lead = await elector.acquire()
        with pytest.raises(ElectionError, match="leading"):
            await elector.acquire()
        await lead.release()
        await lead.release()  # idempotent
        again = await elector.acquire()
        assert again.held
        await again.release()


async def test_release_bound_to_acquiring_task() -> None:
    async with LocalElector() as elector:
        leads: list[aioelect.Leadership] = []

        async def take() -> None:
            leads.append(await elector.acquire())

        await asyncio.create_task(take())
        lead = leads[0]
        with anyio.fail_after(5):
            while lead.held:
                await asyncio.sleep(0.01)
        assert not lead.lost
        # The elector is free again.
        (await elector.acquire()).held  # noqa: B018


async def test_release_when_acquiring_task_is_cancelled() -> None:
    async with LocalElector() as elector:
        got = asyncio.Event()
        leads: list[aioelect.Leadership] = []

        async def take_and_wait() -> None:
            leads.append(await elector.acquire())
            got.set()
            await asyncio.sleep(3600)

        task = asyncio.create_task(take_and_wait())
        await got.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with anyio.fail_after(5):
            while leads[0].held:
                await asyncio.sleep(0.01)


async def test_aclose_releases_and_refuses_further_use() -> None:
    elector = LocalElector()
    lead = await elector.acquire()
    await elector.aclose()
    assert not lead.held
    with pytest.raises(ElectionError, match="closed"):
        await elector.acquire()
    await elector.aclose()  # idempotent


async def test_leadership_scope_runs_body_and_releases() -> None:
    async with LocalElector(identity="scoped") as elector:
        async with leadership(elector) as lead:
            assert lead.held
            assert await elector.leader() == "scoped"
        assert not lead.held
        assert await elector.leader() is None


async def test_leadership_without_elector_uses_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AIOELECT_ETCD_ENDPOINTS", "AIOELECT_MYSQL_DSN", "AIOELECT_POSTGRES_DSN", "AIOELECT_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AIOELECT_NAME", "from-env")
    async with leadership(identity="env-built") as lead:
        assert lead.held and lead.identity == "env-built"
    assert not lead.held


async def test_release_inside_body_ends_leadership_without_loss() -> None:
    async with LocalElector() as elector:
        async with leadership(elector) as lead:
            await lead.release()
            assert not lead.held
        assert not lead.lost


async def test_run_returns_result_and_releases() -> None:
    async with LocalElector() as elector:

        async def work(x: int, y: int) -> int:
            assert elector.leading
            return x + y

        assert await elector.run(work, 2, 3) == 5
        assert not elector.leading


async def test_body_exception_propagates_and_releases() -> None:
    async with LocalElector() as elector:
        with pytest.raises(KeyError):
            async with leadership(elector):
                raise KeyError("boom")
        assert not elector.leading
        lead = await elector.acquire()
        await lead.release()


async def test_identity_validation() -> None:
    with pytest.raises(ValueError, match="identity"):
        LocalElector(identity="")
    with pytest.raises(ValueError, match="identity"):
        LocalElector(identity="x" * 129)
    with pytest.raises(ValueError, match="identity"):
        LocalElector(identity="bad\nline")
    elector = LocalElector()
    host_pid = elector.identity.rsplit(":", 1)[0]
    assert host_pid.endswith(f":{__import__('os').getpid()}")
    assert LocalElector().identity != elector.identity
    elector.identity = "renamed"
    assert elector.identity == "renamed"


async def test_name_validation() -> None:
    with pytest.raises(ValueError, match="name"):
        LocalElector(name="")
    with pytest.raises(ValueError, match="name"):
        LocalElector(name="has space")


async def test_stop_timeout_validation() -> None:
    with pytest.raises(ValueError, match="stop_timeout"):
        LocalElector(stop_timeout=0)


async def test_transitions_are_logged_with_context(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="aioelect")
    async with LocalElector(name="logged", identity="who") as elector:
        lead = await elector.acquire()
        await lead.release()
    records = [r for r in caplog.records if r.name == "aioelect"]
    assert any("acquired" in r.getMessage() for r in records)
    assert any("released" in r.getMessage() for r in records)
    for record in records:
        assert record.backend == "local"  # type: ignore[attr-defined]
        assert record.election == "logged"  # type: ignore[attr-defined]
        assert record.identity == "who"  # type: ignore[attr-defined]


def test_factory_priority() -> None:
    pytest.importorskip("aiomysql")
    mysql = aioelect.new(mysql="mysql://u:secret@127.0.0.1:3306/db", name="job")
    assert isinstance(mysql, aioelect.MySQLElector) and mysql.name == "job"
    assert "secret" not in repr(mysql)
    assert isinstance(aioelect.new(), LocalElector)
    etcd = aioelect.new(etcd="127.0.0.1:2379", mysql="mysql://u@127.0.0.1/db")
    assert etcd.backend == "etcd"
    assert etcd.name == "/aioelect/leader"


def test_from_env_selection() -> None:
    env = {"AIOELECT_MYSQL_DSN": "mysql://root@127.0.0.1:3306/db", "AIOELECT_NAME": "n1"}
    elector = aioelect.from_env(env)
    assert elector.backend == "mysql" and elector.name == "n1"
    env["AIOELECT_ETCD_ENDPOINTS"] = "127.0.0.1:2379,127.0.0.1:22379"
    assert aioelect.from_env(env).backend == "etcd"
    assert aioelect.from_env({}).backend == "local"
    assert aioelect.from_env({"AIOELECT_MYSQL_DSN": ""}).backend == "local"
    assert aioelect.from_env(env, etcd=None).backend == "mysql"


def test_factory_rejects_unknown_options() -> None:
    with pytest.raises(TypeError):
        aioelect.new(mysql="mysql://root@127.0.0.1/db", bogus=1)


def test_leadership_lost_carries_reason() -> None:
    exc = LeadershipLost("lock gone")
    assert exc.reason == "lock gone" and isinstance(exc, ElectionError)
