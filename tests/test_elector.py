"""The backend-independent contract, on the local backend, plus the factory.

No test here starts a server: the file runs on every supported Python.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

import anyio
import pytest

import aioelect
from aioelect import ElectionError, FileElector, LeadershipLost, LocalElector, leadership


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


async def test_acquire_cancelled_at_any_moment_leaves_the_elector_idle_and_the_lock_free() -> None:
    """A cancel that reaches acquire() at any moment of its campaign, even while the campaign's leader watch
    stops, leaves the elector able to campaign again and gives back whatever the campaign won."""
    from aioelect.testing import MemoryElector

    elector = MemoryElector(name="cancelled-acquire")
    other = MemoryElector(name="cancelled-acquire")

    async def lead_once() -> None:
        lead = await elector.acquire()
        await lead.release()

    for i in range(400):
        task = asyncio.create_task(lead_once())
        await asyncio.sleep((i % 16) * 0.0003)
        task.cancel()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        assert not isinstance(outcome, ElectionError), f"round {i}: {outcome}"
        # The lock comes free (a leadership whose task ended is released in the background): nothing the
        # cancelled campaign won is kept.
        with anyio.fail_after(2, shield=True):
            while (probe := await other.try_acquire()) is None:
                await asyncio.sleep(0.001)
        await probe.release()
    await elector.aclose()
    await other.aclose()


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
    monkeypatch.setenv("AIOELECT_BACKEND", "local")
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


async def test_run_passes_keyword_arguments_as_kazoo_does() -> None:
    async with LocalElector() as elector:

        async def work(kind: str, *, label: str) -> str:
            assert aioelect.current_leadership().held
            return f"{kind} {label}"

        assert await elector.run(work, "nightly", label="report") == "nightly report"


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
    assert isinstance(aioelect.new(local=True), LocalElector)
    pytest.importorskip("aetcd")
    etcd = aioelect.new(etcd="127.0.0.1:2379", mysql="mysql://u@127.0.0.1/db", name="/job")
    assert etcd.backend == "etcd"
    assert etcd.name == "/job"


def test_from_env_selection() -> None:
    pytest.importorskip("aiomysql")
    pytest.importorskip("aetcd")
    env = {"AIOELECT_MYSQL_DSN": "mysql://root@127.0.0.1:3306/db", "AIOELECT_NAME": "n1"}
    elector = aioelect.from_env(env)
    assert elector.backend == "mysql" and elector.name == "n1"
    env["AIOELECT_ETCD_ENDPOINTS"] = "127.0.0.1:2379,127.0.0.1:22379"
    assert aioelect.from_env(env).backend == "etcd"
    assert aioelect.from_env({"AIOELECT_BACKEND": "local"}).backend == "local"
    assert aioelect.from_env({"AIOELECT_MYSQL_DSN": "", "AIOELECT_BACKEND": "local"}).backend == "local"
    assert aioelect.from_env(env, etcd=None).backend == "mysql"
    # AIOELECT_BACKEND picks one of several configured backends.
    assert aioelect.from_env({**env, "AIOELECT_BACKEND": "mysql"}).backend == "mysql"


def test_factory_rejects_unknown_options() -> None:
    pytest.importorskip("aiomysql")
    with pytest.raises(TypeError):
        aioelect.new(mysql="mysql://root@127.0.0.1/db", name="job", bogus=1)


def test_leadership_lost_carries_reason() -> None:
    exc = LeadershipLost("lock gone")
    assert exc.reason == "lock gone" and isinstance(exc, ElectionError)


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aioelect" and r.levelno >= logging.ERROR]


async def test_wait_for_around_acquire_is_never_silently_released(caplog: pytest.LogCaptureFixture) -> None:
    async with LocalElector() as elector:
        lead = await asyncio.wait_for(elector.acquire(), 5)
        await asyncio.sleep(0.05)  # the keeper has run
        if sys.version_info >= (3, 12):
            # wait_for() runs acquire() in the caller's task: the leadership is bound to the caller.
            assert lead.held
            lead.check()
            await lead.release()
            assert not errors_logged(caplog)
        else:
            # wait_for() ran acquire() in a task of its own, which ended as acquire() returned.
            assert not lead.held and lead.lost
            assert lead.lost_reason is not None and "acquire(timeout=" in lead.lost_reason
            with pytest.raises(LeadershipLost, match="wait_for"):
                lead.check()
            assert any("wait_for" in m and "acquire(timeout=" in m for m in errors_logged(caplog))
        again = await elector.acquire()  # the elector is free again
        assert again.held
        await again.release()


async def test_acquire_in_a_task_of_its_own_fails_loudly(caplog: pytest.LogCaptureFixture) -> None:
    # What asyncio.wait_for() does on Python 3.10 and 3.11, on every Python.
    async with LocalElector() as elector:
        lead = await asyncio.create_task(elector.acquire())
        with anyio.fail_after(5):
            await lead.wait_lost()
        assert not lead.held and lead.lost
        assert lead.lost_reason is not None
        for fix in ("acquire(timeout=", "asyncio.timeout()", "anyio.fail_after()"):
            assert fix in lead.lost_reason
        with pytest.raises(LeadershipLost, match="ended as soon as acquire"):
            lead.check()
        assert len(errors_logged(caplog)) == 1
        await lead.release()  # returns once the backend has let go
        assert await elector.leader() is None


async def test_acquire_timeout_keeps_the_binding_to_the_caller() -> None:
    async with LocalElector(identity="timed") as elector:
        leads: list[aioelect.Leadership] = []
        hold = asyncio.Event()

        async def take() -> None:
            leads.append(await elector.acquire(timeout=5))
            await asyncio.sleep(0.05)
            assert leads[0].held  # bound to this task, which is still running
            hold.set()
            await asyncio.sleep(0.05)

        await asyncio.create_task(take())
        assert hold.is_set()
        with anyio.fail_after(5):
            await leads[0].release()  # waits for the release the task's end started
        assert not leads[0].held and not leads[0].lost  # released when the task ended, not lost


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout() is new in Python 3.11")
async def test_asyncio_timeout_keeps_the_binding() -> None:
    async with LocalElector() as elector:
        async with asyncio.timeout(5):  # type: ignore[attr-defined,unused-ignore]
            lead = await elector.acquire()
        await asyncio.sleep(0.05)
        assert lead.held
        await lead.release()


async def test_anyio_fail_after_keeps_the_binding() -> None:
    async with LocalElector() as elector:
        with anyio.fail_after(5):
            lead = await elector.acquire()
        await asyncio.sleep(0.05)
        assert lead.held
        await lead.release()


async def test_acquire_timeout_raises_and_leaves_the_elector_idle(tmp_path: Path) -> None:
    # A lock file: candidates exclude each other without a server.
    path = tmp_path / "timeout.lock"
    async with FileElector(path, name="t") as a, FileElector(path, name="t") as b:
        lead = await a.acquire()
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"not leader of t within 0\.3s"):
            await b.acquire(timeout=0.3)
        assert 0.3 <= time.monotonic() - started < 3
        assert not b.leading and lead.held
        await lead.release()
        lead_b = await b.acquire(timeout=5)
        assert lead_b.held
        await lead_b.release()


async def test_acquire_timeout_validation() -> None:
    async with LocalElector() as elector:
        for bad in (0, -1, float("nan"), float("inf"), "1"):
            with pytest.raises(ValueError, match="timeout"):
                await elector.acquire(timeout=bad)  # type: ignore[arg-type]
        assert not elector.leading


async def test_release_waits_for_work_that_ignores_cancellation(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("aioelect.core._elector.STILL_RUNNING_LOG_INTERVAL", 0.2, raising=False)
    async with LocalElector(identity="stubborn", stop_timeout=0.2) as elector:
        inside = asyncio.Event()
        stopped: list[float] = []
        leads: list[aioelect.Leadership] = []

        async def work() -> None:
            async with leadership(elector) as lead:
                leads.append(lead)
                inside.set()
                try:
                    await asyncio.sleep(3600)
                finally:
                    with anyio.CancelScope(shield=True):
                        await asyncio.sleep(1.0)
                    stopped.append(time.monotonic())

        task = asyncio.create_task(work())
        await inside.wait()
        releasing = asyncio.create_task(leads[0].release())
        await asyncio.sleep(0.6)
        # Past stop_timeout: the work still runs, so the lock is still ours.
        assert not releasing.done()
        assert await elector.leader() == "stubborn"
        assert not leads[0].held
        with anyio.fail_after(5):
            await releasing
        released = time.monotonic()
        assert stopped and stopped[0] <= released
        assert await elector.leader() is None
        assert not leads[0].lost
        keeping = [m for m in errors_logged(caplog) if "keeping the lock" in m]
        assert len(keeping) >= 2, errors_logged(caplog)
        await task


def test_server_backends_require_a_name() -> None:
    pytest.importorskip("aiomysql")
    pytest.importorskip("asyncpg")
    pytest.importorskip("aetcd")
    for backend, target in (
        ("mysql", "mysql://u@127.0.0.1:3306/db"),
        ("postgres", "postgresql://u@127.0.0.1/db"),
        ("etcd", "127.0.0.1:2379"),
    ):
        with pytest.raises(ValueError, match="name") as info:
            aioelect.new(**{backend: target})
        message = str(info.value)
        assert "AIOELECT_NAME" in message and "name=" in message
        assert "unrelated" in message  # says why
    env_var = {
        "mysql": ("AIOELECT_MYSQL_DSN", "mysql://u:hunter2@127.0.0.1:3306/db"),
        "postgres": ("AIOELECT_POSTGRES_DSN", "postgresql://u:hunter2@127.0.0.1/db"),
        "etcd": ("AIOELECT_ETCD_ENDPOINTS", "127.0.0.1:2379"),
    }
    for variable, value in env_var.values():
        with pytest.raises(ValueError, match="AIOELECT_NAME") as info:
            aioelect.from_env({variable: value})
        assert "hunter2" not in str(info.value)
        with pytest.raises(ValueError, match="AIOELECT_NAME"):
            aioelect.from_env({variable: value, "AIOELECT_NAME": ""})
        assert aioelect.from_env({variable: value, "AIOELECT_NAME": "billing-cron"}).name.endswith("billing-cron")
    # Constructors: name is a required keyword.
    from aioelect import EtcdElector, MySQLElector, PostgresElector

    for build in (
        lambda: MySQLElector("mysql://u@127.0.0.1:3306/db"),  # type: ignore[call-arg]
        lambda: PostgresElector("postgresql://u@127.0.0.1/db"),  # type: ignore[call-arg]
        lambda: EtcdElector("127.0.0.1:2379"),  # type: ignore[call-arg]
    ):
        with pytest.raises(TypeError, match="name"):
            build()


def test_host_local_backends_keep_a_default_name(tmp_path: Path) -> None:
    assert aioelect.new(local=True).backend == "local"
    assert aioelect.new(local=True).name == "aioelect/leader"
    elector = aioelect.new(file=str(tmp_path / "service.lock"))
    assert elector.backend == "file" and elector.name


# --- nothing configured is an error, never a silent local elector ------------------------------------


def test_from_env_with_nothing_configured_raises_listing_the_variables() -> None:
    for environ in ({}, {"AIOELECT_MYSQL_DSN": "", "AIOELECT_NAME": "n"}):
        with pytest.raises(ValueError, match="no backend configured") as info:
            aioelect.from_env(environ)
        message = str(info.value)
        for variable in (
            "AIOELECT_ETCD_ENDPOINTS",
            "AIOELECT_MYSQL_DSN",
            "AIOELECT_POSTGRES_DSN",
            "AIOELECT_FILE",
            "AIOELECT_BACKEND=local",
        ):
            assert variable in message
    with pytest.raises(ValueError, match="local=True"):
        aioelect.new()
    with pytest.raises(ValueError, match="choose one backend"):
        aioelect.new(local=True, file="/tmp/x.lock")


def test_local_is_chosen_only_explicitly_and_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="aioelect"):
        elector = aioelect.from_env({"AIOELECT_BACKEND": "LOCAL", "AIOELECT_NAME": "dev"})
    assert isinstance(elector, LocalElector) and elector.name == "dev"
    assert "WITHOUT mutual exclusion" in caplog.text
    with pytest.raises(ValueError, match="AIOELECT_BACKEND must be one of"):
        aioelect.from_env({"AIOELECT_BACKEND": "zookeeper"})
    with pytest.raises(ValueError, match="AIOELECT_BACKEND=file but AIOELECT_FILE is not set"):
        aioelect.from_env({"AIOELECT_BACKEND": "file"})
    with pytest.raises(ValueError, match="choose one backend"):
        aioelect.from_env({"AIOELECT_BACKEND": "local"}, file="/tmp/x.lock")


async def test_leadership_without_configuration_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AIOELECT_ETCD_ENDPOINTS", "AIOELECT_MYSQL_DSN", "AIOELECT_POSTGRES_DSN", "AIOELECT_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("AIOELECT_BACKEND", raising=False)
    with pytest.raises(ValueError, match="no backend configured"):
        async with leadership():
            raise AssertionError("the body must not run")


# --- the current leadership inside leader work --------------------------------------------------------


async def test_current_leadership_inside_leader_work_and_its_tasks() -> None:
    async with LocalElector(identity="ctx") as elector:
        seen: list[aioelect.Leadership] = []

        async def deep() -> None:
            seen.append(aioelect.current_leadership())

        async def work(tag: str) -> str:
            lead = aioelect.current_leadership()
            lead.check()
            assert lead.token is not None
            await asyncio.create_task(deep())  # a spawned task sees it too (its context is a copy)
            seen.append(lead)
            return tag

        assert await elector.run(work, "done") == "done"
        assert len(seen) == 2 and seen[0] is seen[1]
        assert not seen[0].held  # released once work returned
        async with leadership(elector) as lead:
            assert aioelect.current_leadership() is lead
            async with anyio.create_task_group() as tg:
                tg.start_soon(deep)
            assert seen[-1] is lead
        with pytest.raises(ElectionError, match="outside leader work"):
            aioelect.current_leadership()
        plain = await elector.acquire()  # a plain acquire() has no body to scope
        with pytest.raises(ElectionError, match="outside leader work"):
            aioelect.current_leadership()
        await plain.release()


def test_current_leadership_outside_any_loop_raises() -> None:
    with pytest.raises(ElectionError, match="outside leader work"):
        aioelect.current_leadership()


# --- try once -------------------------------------------------------------------------------------------


async def test_try_acquire_and_leadership_without_waiting_on_local() -> None:
    async with LocalElector(identity="once") as elector:
        lead = await elector.try_acquire()
        assert lead is not None and lead.held and lead.token is not None
        assert elector.last_leader == "once"
        with pytest.raises(ElectionError, match="leading"):
            await elector.try_acquire()
        await lead.release()
        assert elector.last_leader is None
        async with leadership(elector, wait=False) as scoped:
            assert scoped is not None and scoped.held
            assert aioelect.current_leadership() is scoped
        assert not scoped.held
        with pytest.raises(TypeError, match="wait"):
            async with leadership(elector, wait="no"):  # type: ignore[call-overload]
                pass


def test_aioelect_backend_names_one_of_several_backends_for_the_command_too() -> None:
    from aioelect.wiring._settings import Settings

    both = {"AIOELECT_MYSQL_DSN": "mysql://u@h/db", "AIOELECT_POSTGRES_DSN": "postgresql://u@h/db"}
    assert Settings.from_environ(both).backend() == ("mysql", "mysql://u@h/db")
    chosen = Settings.from_environ({**both, "AIOELECT_BACKEND": "postgres"})
    assert chosen.backend_kind == "postgres" and chosen.backend() == ("postgres", "postgresql://u@h/db")
    assert "backend_kind='postgres'" in repr(chosen)
    # The command line never leads locally: local names no server, so the command finds none configured.
    assert Settings.from_environ({"AIOELECT_BACKEND": "local"}).backend() is None


def test_lock_timing_names_the_lease_and_the_renew_deadline() -> None:
    assert LocalElector().lock_timing() is None
    etcd = aioelect.EtcdElector("127.0.0.1:2379", name="timing", ttl=6)  # connects to nothing yet
    margin, lease, deadline = etcd.lock_timing() or (0.0, 0.0, 0.0)
    assert lease == 6 and 0 < deadline < lease and margin == lease - deadline
