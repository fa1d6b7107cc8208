"""The Redis backend against real throwaway ``redis-server`` processes: options, tokens, losses, TLS and ACL.

The contract suite (test_contract.py) covers the behaviour every backend
shares; the process faults are in test_faults_redis.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from aioelect import PermanentBackendError, RedisElector, from_env, leadership, new
from aioelect.backends.redis import RedisBackend

from .backends import REDIS, unique_name
from .harness import Certificates, RedisServer, redis_command

PASSWORD = "s3cr#t/pw?x"


def lock_key(name: str) -> str:
    return f"aioelect:{{{name}}}:lock"


def make(url: str, name: str, **kw: object) -> RedisElector:
    return RedisElector(url, name=name, **{**REDIS, **kw})  # type: ignore[arg-type]


# --- options, URLs, redaction -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("mysql://h/0", {}, "scheme"),
        ("redis://h/x", {}, "database number"),
        ("redis://h/0?foo=1", {}, "unsupported Redis URL parameter 'foo'"),
        ("redis://h/0?ssl_ca_certs=/nonexistent", {}, "rediss://"),
        ("rediss://h/0?ssl_ca_certs=/nonexistent", {}, "does not exist"),
        ("redis://h/0", {"lease": 3, "check_interval": 1, "check_timeout": 2}, "renew_deadline"),
        ("redis://h/0", {"lease": 2, "check_interval": 0.2, "check_timeout": 0.5}, "keep-alives"),
        ("redis://h/0", {"min_replicas": -1}, "min_replicas"),
        ("redis://h/0", {"volatile_tokens": "yes"}, "volatile_tokens"),
        ("redis://h/0", {"key_prefix": "a{b"}, "key_prefix"),
    ],
)
def test_bad_options_are_value_errors(url: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisElector(url, name="n", **options)  # type: ignore[arg-type]


def test_name_with_a_brace_is_refused_and_unknown_options_are_type_errors() -> None:
    with pytest.raises(ValueError, match="hash tag"):
        RedisElector("redis://h/0", name="a{b}")
    with pytest.raises(TypeError, match="ttl"):
        RedisElector("redis://h/0", name="n", ttl=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="name"):
        new(redis="redis://h/0")


def test_the_password_never_shows(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"redis://user:{PASSWORD.replace('#', '%23').replace('/', '%2F').replace('?', '%3F')}@db.example:6380/2"
    elector = from_env({"AIOELECT_REDIS_URL": url, "AIOELECT_NAME": "n"})
    backend = elector._backend
    assert isinstance(backend, RedisBackend)
    assert backend.settings.password == PASSWORD and backend.settings.db == 2 and backend.settings.port == 6380
    shown = [repr(elector), repr(backend), repr(backend.settings), backend.describe_timing(), caplog.text]
    for text in shown:
        assert PASSWORD not in text and "s3cr" not in text, text
    assert "user:***@db.example:6380" in backend.describe_timing()
    assert "not encrypted" in caplog.text  # a non-loopback host without TLS is warned about
    with pytest.raises(ValueError) as info:
        RedisElector(f"redis://user:{PASSWORD}@h/0", name="n")  # unencoded '#': refused, never quoted
    assert "s3cr" not in str(info.value)


# --- tokens that never go back ----------------------------------------------------------------


@pytest.fixture
def volatile_redis() -> Iterator[RedisServer]:
    """A Redis without the append-only file: a crash or restart forgets every key."""
    with RedisServer(appendfsync=None) as server:
        yield server


async def test_a_server_that_can_lose_a_token_is_refused_unless_volatile_tokens(
    volatile_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique_name()
    async with make(volatile_redis.url, name) as elector:
        with pytest.raises(PermanentBackendError, match=r"appendonly no.*volatile_tokens=True"):
            await elector.acquire(timeout=5)
        with pytest.raises(PermanentBackendError, match="appendonly no"):
            await elector.try_acquire()
    assert volatile_redis.command("EXISTS", lock_key(name)) == 0
    with RedisServer(appendfsync="everysec") as everysec:
        async with make(everysec.url, name) as elector:
            with pytest.raises(PermanentBackendError, match="'everysec', not 'always'"):
                await elector.acquire(timeout=5)
    caplog.clear()
    async with make(volatile_redis.url, name, volatile_tokens=True) as elector:
        lead = await elector.acquire(timeout=5)
        assert lead.token == 1
        await lead.release()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("volatile_tokens=True" in m and "may repeat" in m for m in warnings), warnings


async def test_config_get_denied_by_acl_is_said_and_refused(caplog: pytest.LogCaptureFixture) -> None:
    acl = ["elector on >pw ~aioelect:* &aioelect:* +@all -config"]
    with RedisServer(acl=acl) as server:
        url = f"redis://elector:pw@127.0.0.1:{server.port}/0"
        async with make(url, unique_name()) as elector:
            with pytest.raises(PermanentBackendError, match="CONFIG GET is denied"):
                await elector.acquire(timeout=5)
        async with make(url, unique_name(), volatile_tokens=True) as elector:
            lead = await elector.acquire(timeout=5)
            assert lead.held
            await lead.release()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("timeout is unknown (CONFIG GET is denied to this user" in m for m in warnings), warnings


async def test_server_killed_right_after_a_grant_the_next_token_is_larger(fresh_redis: RedisServer) -> None:
    name = unique_name()
    for _ in range(3):
        async with make(fresh_redis.url, name, identity="first") as elector:
            lead = await elector.acquire(timeout=5)
            first = lead.token
            assert first is not None
            await anyio.to_thread.run_sync(fresh_redis.kill)  # SIGKILL: no shutdown, nothing flushed later
            await anyio.to_thread.run_sync(fresh_redis.start)
            fresh_redis.command("DEL", lock_key(name))  # the old grant survived too; let the next one in
        async with make(fresh_redis.url, name, identity="second") as elector:
            lead = await elector.acquire(timeout=10)
            assert lead.token is not None and lead.token > first, (first, lead.token)
            await lead.release()


# --- losses -----------------------------------------------------------------------------------


async def test_key_deleted_or_changed_by_an_operator_is_a_loss_seen_within_check_interval(
    redis_server: RedisServer,
) -> None:
    for change in (("DEL",), ("SET", "someone-else")):
        name = unique_name()
        async with make(redis_server.url, name) as elector:
            lead = await elector.acquire(timeout=5)
            changed = time.monotonic()
            redis_server.command(change[0], lock_key(name), *change[1:])
            with anyio.fail_after(5):
                await lead.wait_lost()
            assert time.monotonic() - changed < REDIS["check_interval"] + REDIS["check_timeout"] + 0.5
            assert "no longer holds our value" in (lead.lost_reason or "")
            if change[0] == "SET":
                assert redis_server.command("GET", lock_key(name)) == "someone-else"  # not ours to delete


async def test_renew_sets_the_expiry_and_never_adds_to_it(redis_server: RedisServer) -> None:
    name = unique_name()
    async with make(redis_server.url, name, lease=4) as elector, leadership(elector):
        for _ in range(8):
            await asyncio.sleep(0.25)
            pttl = redis_server.command("PTTL", lock_key(name))
            assert 0 < pttl <= 4000, pttl


async def test_a_release_wakes_a_waiter_at_once(redis_server: RedisServer) -> None:
    name = unique_name()
    delays = []
    async with make(redis_server.url, name, poll_interval=5) as a, make(redis_server.url, name, poll_interval=5) as b:
        for _ in range(5):
            lead = await a.acquire(timeout=5)
            follower = asyncio.create_task(b.acquire(timeout=10))
            await asyncio.sleep(0.3)
            released = time.monotonic()
            await lead.release()
            got = await follower
            delays.append(time.monotonic() - released)
            # acquire() in a task of its own: its leadership ends with that task (already over).
            with anyio.fail_after(5):
                while got.held:
                    await asyncio.sleep(0.01)
    print(f"MEASURED redis handover after release: median {sorted(delays)[2] * 1000:.1f} ms")
    assert sorted(delays)[2] < 0.5, delays  # published, not polled (poll_interval=5)


async def test_restart_without_aof_is_a_loss_and_with_aof_keeps_the_leadership(fresh_redis: RedisServer) -> None:
    name = unique_name()
    async with make(fresh_redis.url, name) as elector:
        lead = await elector.acquire(timeout=5)
        await anyio.to_thread.run_sync(fresh_redis.restart)  # the key and its expiry are in the AOF
        await asyncio.sleep(1.0)
        assert lead.held and not lead.lost
        await lead.release()
    with RedisServer(appendfsync=None) as volatile:
        async with make(volatile.url, name, volatile_tokens=True) as elector:
            lead = await elector.acquire(timeout=5)
            await anyio.to_thread.run_sync(volatile.restart)
            with anyio.fail_after(5):
                await lead.wait_lost()
            assert lead.lost_reason


# --- TLS and ACL ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_redis(certs: Certificates) -> Iterator[RedisServer]:
    with RedisServer(tls=certs) as server:
        yield server


async def test_tls_with_a_verified_certificate(tls_redis: RedisServer, certs: Certificates) -> None:
    assert tls_redis.url.startswith("rediss://")
    async with make(tls_redis.url, unique_name()) as elector:
        lead = await elector.acquire(timeout=5)
        assert lead.held and await elector.leader() == elector.identity
        await lead.release()
    wrong = f"rediss://127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={certs.other_ca}"
    async with make(wrong, unique_name()) as elector:
        started = time.monotonic()
        with pytest.raises(PermanentBackendError, match="TLS handshake failed"):
            await elector.acquire(timeout=10)
        assert time.monotonic() - started < 5, "a refused certificate is permanent, never retried"
    plain = f"redis://127.0.0.1:{tls_redis.port}/0"
    async with make(plain, unique_name(), connect_timeout=1, check_timeout=0.5) as elector:
        with pytest.raises(TimeoutError):
            await elector.acquire(timeout=2)  # a TLS port spoken to in plaintext never grants


#: The least an elector needs, as docs/backends.md gives it (tests/test_redis_security.py runs the page's text).
MINIMAL_ACL = (
    "elector on >pw resetkeys ~aioelect:* resetchannels &aioelect:* "
    "-@all +eval +evalsha +get +set +del +incr +pexpire +pttl +publish +wait +subscribe +unsubscribe +ping +info "
    "+role"
)


async def test_an_acl_user_limited_to_its_keys_campaigns_and_nothing_more() -> None:
    with RedisServer(acl=[MINIMAL_ACL]) as server:
        url = f"redis://elector:pw@127.0.0.1:{server.port}/0?assume_appendfsync=always&assume_timeout=0"
        name = unique_name()
        async with make(url, name, identity="a") as a, make(url, name, identity="b") as b:
            lead = await a.acquire(timeout=5)
            assert await b.leader() == "a"
            assert await b.try_acquire() is None
            # Past the renew deadline (0.7 x lease): held only if the renews (script and ROLE) confirmed.
            await asyncio.sleep(0.7 * REDIS["lease"] + 0.5)
            assert lead.held, lead.lost_reason
            await lead.release()
            seen = []

            async def watch() -> None:
                async for current in b.observe():
                    seen.append(current)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                lead_b = await b.acquire(timeout=5)
                with anyio.fail_after(5):
                    while seen[-1:] != ["b"]:
                        await asyncio.sleep(0.01)
                await lead_b.release()
                tg.cancel_scope.cancel()
        with pytest.raises(RuntimeError, match="NOPERM"):
            redis_command(server.port, "GET", "other:key", user="elector", password="pw")
        outside = RedisElector(url, name="n", key_prefix="other:", **REDIS)  # type: ignore[arg-type]
        async with outside:
            started = time.monotonic()
            with pytest.raises(PermanentBackendError, match=r"refused the campaign.*(?i:permission|can.t access)"):
                await outside.acquire(timeout=5)
            assert time.monotonic() - started < 3, "a denied key is permanent, never retried"


async def test_an_acl_user_denied_role_is_refused_at_the_campaign() -> None:
    """Every renew reads ``ROLE``: a user without it is refused before it leads, not fenced at its first renew."""
    with RedisServer(acl=[MINIMAL_ACL.replace(" +role", "")]) as server:
        url = f"redis://elector:pw@127.0.0.1:{server.port}/0?assume_appendfsync=always&assume_timeout=0"
        async with make(url, unique_name()) as elector:
            with pytest.raises(PermanentBackendError, match=r"refused the campaign.*role"):
                await elector.acquire(timeout=5)


def test_a_sentinel_url_names_the_sentinels_and_the_master_never_the_password() -> None:
    url = "redis+sentinel://user:pw%23x@127.0.0.1:26379,127.0.0.2:26380/mymaster/3?master_hosts=127.0.0.1"
    backend = RedisBackend(url, name="n")
    s = backend.settings
    assert s.sentinels == (("127.0.0.1", 26379), ("127.0.0.2", 26380)) and s.master_name == "mymaster"
    assert (s.username, s.password, s.db) == ("user", "pw#x", 3)
    assert s.url == "redis+sentinel://user:***@127.0.0.1:26379,127.0.0.2:26380/mymaster/3"
    assert "pw" not in repr(backend) + repr(s) + backend.describe_timing()
    with pytest.raises(ValueError, match="name the master"):
        RedisBackend("redis+sentinel://127.0.0.1:26379", name="n")


@pytest.mark.parametrize("once", [True, False], ids=["try_acquire", "acquire"])
async def test_aclose_as_a_campaign_wins_gives_the_key_back_before_closing(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, once: bool
) -> None:
    """aclose() from another task, between the campaign step's win and the acquiring task resuming: the key is
    given back, not left to its lease by a backend already closed."""
    from aioelect.core import _tasks

    name = unique_name()
    elector = make(redis_server.url, name)
    closers: list[asyncio.Task[None]] = []
    start = _tasks.TaskSet.start

    def hooked(self: _tasks.TaskSet, coro: Any, *, name: str, on_done: Any = None) -> asyncio.Task[Any]:
        task = start(self, coro, name=name, on_done=on_done)
        if name.startswith("aioelect-campaign-"):

            def close_now(step: asyncio.Task[Any]) -> None:
                if not step.cancelled() and step.exception() is None and step.result() is not None:
                    closers.append(asyncio.get_running_loop().create_task(elector.aclose()))

            task.add_done_callback(close_now)
        return task

    monkeypatch.setattr(_tasks.TaskSet, "start", hooked)
    with pytest.raises(Exception, match="closed"):
        await (elector.try_acquire() if once else elector.acquire())
    assert closers, "the hook never saw the step win"
    await asyncio.gather(*closers)
    assert redis_server.command("EXISTS", lock_key(name)) == 0


async def test_a_campaign_cancelled_as_its_grant_arrives_is_cancelled_and_leaves_no_key(
    redis_server: RedisServer,
) -> None:
    """redis-py can finish a request although its task was cancelled meanwhile: the grant must not survive that."""
    name = unique_name()
    for i in range(40):
        async with make(redis_server.url, name) as elector:

            async def lead(elector: RedisElector = elector) -> None:
                await elector.acquire()
                await asyncio.sleep(3600)

            task = asyncio.create_task(lead())
            await asyncio.sleep((i % 10) * 0.0005)
            task.cancel()
            with anyio.fail_after(5):  # a swallowed cancellation would leave the task leading and asleep
                await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled()
        with anyio.fail_after(5):
            while redis_server.command("EXISTS", lock_key(name)):
                await asyncio.sleep(0.01)


# --- what a waiting candidate costs, and what it still checks ---------------------------------------


def command_counts(server: RedisServer) -> dict[str, int]:
    """The server's calls per command (``INFO commandstats``) and its connections received so far."""
    counts = {"connections": int(server.command("INFO", "stats").split("total_connections_received:")[1].split()[0])}
    for line in str(server.command("INFO", "commandstats")).splitlines():
        if line.startswith("cmdstat_"):
            name, _, fields = line[len("cmdstat_") :].partition(":")
            counts[name] = int(fields.split(",")[0].partition("=")[2])
    return counts


async def test_a_waiter_reads_only_the_expiry_while_the_leader_renews_and_handoffs_open_no_connection() -> None:
    """A waiter tries only when a change is published or the key can have expired (then one PTTL); a new
    campaign reuses the elector's subscription and lock connection."""
    name = unique_name()
    with RedisServer() as server:
        async with make(server.url, name, lease=3.5) as a, make(server.url, name, poll_interval=0.2) as b:
            lead = await a.acquire(timeout=5)
            waiter = asyncio.create_task(b.acquire(timeout=30))
            await asyncio.sleep(0.5)  # b tried once and waits
            before = command_counts(server)
            await asyncio.sleep(4.0)
            after = command_counts(server)
            assert not waiter.done()
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            # The leader renews 20 times (a script, its GET and PEXPIRE, ROLE, INFO); b reads the expiry about
            # once per lease (3.5 s), and never tries (no CONFIG GET), where a try per poll_interval would be 20.
            assert delta.get("config|get", 0) == 0, delta
            assert delta.get("pttl", 0) <= 4, delta
            await lead.release()
            got = await waiter
            # Leaderships go back and forth: every campaign after each elector's first opens no connection.
            first = command_counts(server)["connections"]
            with anyio.fail_after(10):
                for _ in range(5):
                    while got.held:  # acquire() in a task of its own: its leadership ended with that task
                        await asyncio.sleep(0.01)
                    lead = await a.acquire(timeout=5)
                    await lead.release()
                    lead = await b.acquire(timeout=5)
                    await lead.release()
            # Only command_counts' own two connections (INFO stats, INFO commandstats) since it read `first`.
            assert command_counts(server)["connections"] - first == 2


async def test_a_setting_changed_while_a_candidate_waits_is_seen_by_its_next_try(
    fresh_redis: RedisServer,
) -> None:
    """The persistence check is not per connection: a CONFIG SET on the waiter's server, and a restart with
    another configuration, are each seen by the try that follows a release, before any grant stands."""
    name = unique_name()
    async with make(fresh_redis.url, name, identity="a") as a, make(fresh_redis.url, name, identity="b") as b:
        lead = await a.acquire(timeout=5)
        waiter = asyncio.create_task(b.acquire(timeout=10))
        await asyncio.sleep(0.5)  # b tried once on this connection and waits
        fresh_redis.command("CONFIG", "SET", "appendfsync", "everysec")
        await lead.release()
        with pytest.raises(PermanentBackendError, match="'everysec', not 'always'"):
            await waiter
        assert fresh_redis.command("EXISTS", lock_key(name)) == 0  # the grant read with the setting is withdrawn
        assert fresh_redis.command("GET", f"aioelect:{{{name}}}:token") == "2"  # a's token, then b's, withdrawn
    fresh_redis.command("CONFIG", "SET", "appendfsync", "always")
    async with make(fresh_redis.url, name, identity="a") as a, make(fresh_redis.url, name, identity="b") as b:
        lead = await a.acquire(timeout=5)
        waiter = asyncio.create_task(b.acquire(timeout=15))
        await asyncio.sleep(0.5)
        fresh_redis.appendfsync = None  # restarted without the append-only file: the key is forgotten too
        await anyio.to_thread.run_sync(fresh_redis.restart)
        with pytest.raises(PermanentBackendError, match="appendonly no"):
            await waiter
        await lead.release()


async def test_a_leader_that_releases_and_campaigns_again_lets_the_waiter_go_first(redis_server: RedisServer) -> None:
    """The releaser's own try would reach the server before a waiter in another process has woken: it waits for a
    grant first. The waiter here is slowed by 20 ms after each message it reads, as a process woken late."""

    class LateWaker:
        async def exchange(self, what: str, send: Any) -> Any:
            reply = await send()
            if what == "release message" and reply is not None:
                await asyncio.sleep(0.02)
            return reply

    name = unique_name()
    firsts = []
    async with make(redis_server.url, name, identity="a") as a, make(redis_server.url, name, identity="b") as b:
        backend = b._backend
        assert isinstance(backend, RedisBackend)
        backend.interceptor = LateWaker()
        for _ in range(5):
            lead = await a.acquire(timeout=5)
            order: list[str] = []

            async def wait_b(order: list[str] = order) -> None:
                got = await b.acquire(timeout=5)
                order.append("b")
                await got.release()

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_b)
                await asyncio.sleep(0.3)  # b tried and waits
                await lead.release()
                again = await a.acquire(timeout=5)
                order.append("a")
                await again.release()
            firsts.append(order[0])
    # A waiter slower than the wait (0.25 s at poll_interval=1) on a loaded machine may lose one round.
    assert firsts.count("b") >= 4, firsts


async def test_a_key_deleted_by_an_operator_is_published_by_the_leaders_next_renew(redis_server: RedisServer) -> None:
    """Nothing publishes a delete: the leader's renew that finds the key gone does, so a waiter (which otherwise
    reads the key again only when it can have expired, 4 s here) takes over within about check_interval."""
    name = unique_name()
    async with make(redis_server.url, name, identity="a") as a, make(redis_server.url, name, identity="b") as b:
        lead = await a.acquire(timeout=5)
        async with anyio.create_task_group() as tg:
            took: list[float] = []

            async def wait_b() -> None:
                got = await b.acquire(timeout=10)
                took.append(time.monotonic())
                await got.release()

            tg.start_soon(wait_b)
            await asyncio.sleep(0.5)  # b tried and waits
            redis_server.command("DEL", lock_key(name))
            deleted = time.monotonic()
        assert took and took[0] - deleted < REDIS["check_interval"] + REDIS["check_timeout"] + 0.5, took[0] - deleted
        with anyio.fail_after(5):
            await lead.wait_lost()
