"""Redis errors sorted into permanent and transient, and the server settings a campaign refuses, on real servers.

Permanent (``PermanentBackendError`` at once, never retried): a wrong
password, a command or key the ACL denies, a database number out of range,
an election key of the wrong type, a setting that could let the key go before
its expiry or keep renews from coming in time. Transient (retried while
campaigning): a connection refused, a read-only replica, a server out of memory.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import anyio
import pytest

from aioelect import PermanentBackendError, RedisElector
from aioelect.backends.redis._bounds import config_problem, least_timeout
from aioelect.backends.redis._options import TIMING
from aioelect.core._config import LockTiming

from .backends import REDIS, unique_name
from .harness import RedisServer

#: A refusal is raised at once: well within the first retry's backoff and the acquire timeout.
PROMPT = 3.0


def make(url: str, name: str, **kw: object) -> RedisElector:
    return RedisElector(url, name=name, **{**REDIS, **kw})  # type: ignore[arg-type]


async def refused(url: str, match: str, **kw: object) -> PermanentBackendError:
    """The PermanentBackendError that acquire(), try_acquire() and leader() raise, each within PROMPT seconds."""
    async with make(url, unique_name(), **kw) as elector:
        started = time.monotonic()
        with pytest.raises(PermanentBackendError, match=match) as info:
            await elector.acquire(timeout=10)
        assert time.monotonic() - started < PROMPT, "a permanent error is raised at once, never retried"
        with pytest.raises(PermanentBackendError, match=match):
            await elector.try_acquire()
        return info.value


@pytest.fixture(scope="module")
def acl_redis() -> Iterator[RedisServer]:
    with RedisServer(acl=["elector on >pw ~aioelect:* &aioelect:* +@all", "reader on >pw ~aioelect:* +@read"]) as s:
        yield s


async def test_a_wrong_password_is_permanent(acl_redis: RedisServer) -> None:
    url = f"redis://elector:not-the-password@127.0.0.1:{acl_redis.port}/0"
    error = await refused(url, r"(?i)WRONGPASS|invalid username-password")
    assert "not-the-password" not in str(error)
    async with make(url, unique_name()) as elector:
        with pytest.raises(PermanentBackendError, match=r"(?i)invalid username-password"):
            await elector.leader()


async def test_a_command_the_acl_denies_is_permanent(acl_redis: RedisServer) -> None:
    # volatile_tokens: past the persistence check (CONFIG GET is denied too), to the script itself.
    await refused(f"redis://reader:pw@127.0.0.1:{acl_redis.port}/0", r"(?i)NOPERM|permission", volatile_tokens=True)


async def test_a_database_number_out_of_range_is_permanent(redis_server: RedisServer) -> None:
    await refused(f"redis://127.0.0.1:{redis_server.port}/99", "DB index is out of range")


@pytest.mark.parametrize(("suffix", "command", "match"), [("lock", "HSET", "WRONGTYPE"), ("token", "SET", "integer")])
async def test_an_election_key_of_the_wrong_kind_is_permanent(
    redis_server: RedisServer, suffix: str, command: str, match: str
) -> None:
    name = unique_name()
    key = f"aioelect:{{{name}}}:{suffix}"
    redis_server.command(command, key, *(("field", "1") if command == "HSET" else ("not a number",)))
    try:
        async with make(redis_server.url, name) as elector:
            started = time.monotonic()
            with pytest.raises(PermanentBackendError, match=match):
                await elector.acquire(timeout=10)
            assert time.monotonic() - started < PROMPT
    finally:
        redis_server.command("DEL", key)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_refused_connection_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aioelect")
    async with make(f"redis://127.0.0.1:{closed_port()}/0", unique_name()) as elector:
        with pytest.raises(TimeoutError):
            await elector.acquire(timeout=1.5)
    assert "campaign interrupted" in caplog.text


async def test_a_read_only_replica_is_retried_until_it_is_promoted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aioelect")
    with RedisServer(replica_of=closed_port()) as replica:
        async with make(replica.url, unique_name()) as elector:
            async with anyio.create_task_group() as tg:
                leads = []

                async def campaign() -> None:
                    lead = await elector.acquire(timeout=15)
                    leads.append(lead.token)
                    await lead.release()

                tg.start_soon(campaign)
                with anyio.fail_after(10):
                    while "not a master" not in caplog.text:  # INFO replication: refused as a replica, and retried
                        await anyio.sleep(0.05)
                assert not leads
                replica.command("REPLICAOF", "NO", "ONE")  # a failover promotes it
            assert leads == [1]


async def test_a_server_out_of_memory_is_retried_until_memory_is_freed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aioelect")
    with RedisServer() as server:
        server.command("CONFIG", "SET", "maxmemory", "1")  # noeviction (the default): writes refused with OOM
        async with make(server.url, unique_name()) as elector:
            with pytest.raises(TimeoutError):
                await elector.acquire(timeout=1.5)
            assert "OutOfMemoryError" in caplog.text and "retrying" in caplog.text
            server.command("CONFIG", "SET", "maxmemory", "0")
            lead = await elector.acquire(timeout=5)
            await lead.release()


# --- server settings ------------------------------------------------------------------------------


async def test_a_server_timeout_shorter_than_the_renews_is_refused_naming_it() -> None:
    with RedisServer(extra_args=["--timeout", "1"]) as server:
        await refused(server.url, r"timeout.*CONFIG SET timeout")
        server.command("CONFIG", "SET", "timeout", "0")
        async with make(server.url, unique_name()) as elector:
            lead = await elector.acquire(timeout=5)
            await lead.release()
        server.command("CONFIG", "SET", "maxmemory", "100mb")
        server.command("CONFIG", "SET", "maxmemory-policy", "volatile-ttl")
        await refused(server.url, r"maxmemory-policy volatile-ttl.*noeviction")
        server.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
        async with make(server.url, unique_name()) as elector:
            lead = await elector.acquire(timeout=5)
            await lead.release()


def timing(**kw: float) -> LockTiming:
    options = {"poll_interval": 1.0, "check_interval": 1.0, "check_timeout": None, "lease": 10.0, **kw}
    return LockTiming.checked(
        TIMING,
        connect_timeout=5,
        renew_deadline=None,
        **options,  # type: ignore[arg-type]
    )


def test_the_least_timeout_covers_the_longest_idle_gap_of_a_connection() -> None:
    # A waiting candidate's connection rests until the lock key can have expired: up to lease.
    t = timing(check_interval=1.0, poll_interval=3.0, lease=10.0)
    assert least_timeout(t) == 11.0
    assert least_timeout(timing(check_interval=1.0, poll_interval=12.0, lease=10.0)) == 13.0
    assert config_problem({"timeout": "11"}, t, server="s") is None
    assert config_problem({"timeout": "0"}, t, server="s") is None
    problem = config_problem({"timeout": "10"}, t, server="s")
    assert problem is not None and "timeout" in problem and "at least 11s" in problem
    # Eviction only with a memory limit; noeviction never deletes a key.
    assert config_problem({"maxmemory": "0", "maxmemory-policy": "allkeys-lru"}, t, server="s") is None
    assert config_problem({"maxmemory": "1000", "maxmemory-policy": "noeviction"}, t, server="s") is None
    evicting = config_problem({"maxmemory": "1000", "maxmemory-policy": "allkeys-lru"}, t, server="s")
    assert evicting is not None and "maxmemory-policy allkeys-lru" in evicting


def test_the_safety_margin_bounds_run_grace() -> None:
    """The key's expiry is the bound: ``aioelect run`` keeps CMD's grace inside lease - renew_deadline."""
    from aioelect.cli._run import KILL_RESERVE, choose_grace
    from aioelect.cli._status import UsageError

    elector = RedisElector("redis://127.0.0.1:1/0", name="n")  # the defaults: lease 10, renew deadline 7
    assert elector.lock_timing() == (3.0, 10.0, 7.0)
    assert choose_grace(None, elector, "redis") == 1.5
    with pytest.raises(UsageError, match="--grace 5 is too long for the redis backend"):
        choose_grace(5.0, elector, "redis")
    assert choose_grace(3.0 - KILL_RESERVE, elector, "redis") == 3.0 - KILL_RESERVE
