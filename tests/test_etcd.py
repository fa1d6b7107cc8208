"""Behaviour of the etcd backend against a real etcd (key layout, handover, interop, leaks...).

Process and server faults are in test_etcd_faults.py.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import os
import re
import secrets
import signal
import statistics
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

import aioelect
from aioelect import BackendUnavailable, ElectionError, Elector, EtcdElector
from aioelect.backends.etcd import EtcdBackend, parse_endpoints
from aioelect.backends.etcd._election import Turn
from aioelect.backends.etcd._session import Session

from .backends import Follower
from .harness import EtcdServer, TCPProxy, free_port, require_binary

pytestmark = pytest.mark.timeout(60)

TTL = 2


def unique() -> str:
    return f"/aioelect-test/{secrets.token_hex(4)}"


async def ctl(server: EtcdServer, *args: str) -> str:
    """Run etcdctl against ``server`` without blocking the event loop; return stdout, fail on error."""
    done = await anyio.to_thread.run_sync(lambda: server.etcdctl(*args, timeout=10))
    assert done.returncode == 0, f"etcdctl {' '.join(args)} failed: {done.stderr}"
    return done.stdout


async def keys(server: EtcdServer, name: str) -> list[dict[str, Any]]:
    """Our election's keys: [{key, value, create_revision, lease (hex)}]."""
    out = json.loads(await ctl(server, "get", "--prefix", name + "/", "-w", "json"))
    return [
        {
            "key": base64.b64decode(kv["key"]).decode(),
            "value": base64.b64decode(kv.get("value", "")).decode(),
            "create_revision": int(kv["create_revision"]),
            "lease": f"{int(kv.get('lease', 0)):x}",
        }
        for kv in out.get("kvs", [])
    ]


async def leases(server: EtcdServer) -> list[str]:
    """Live lease IDs in hex as election.go writes them in keys (etcdctl pads them with zeros)."""
    out = await ctl(server, "lease", "list")
    return [f"{int(line, 16):x}" for line in out.splitlines()[1:] if line.strip()]


async def eventually(predicate: Callable[[], Any], timeout: float, what: str) -> float:
    """Poll (async) ``predicate`` until true; return the time it took."""
    start = time.monotonic()
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def electors(etcd: EtcdServer) -> AsyncIterator[Callable[..., EtcdElector]]:
    """make(identity, name=..., **options) -> EtcdElector on the session etcd, closed after the test."""
    made: list[EtcdElector] = []

    def make(identity: str, name: str, **options: Any) -> EtcdElector:
        options.setdefault("ttl", TTL)
        elector = EtcdElector(etcd.endpoints, name=name, identity=identity, **options)
        made.append(elector)
        return elector

    yield make
    for elector in made:
        await elector.aclose()


# --- construction --------------------------------------------------------------------------


def test_endpoints_forms() -> None:
    assert [str(e) for e in parse_endpoints("127.0.0.1:2379, http://localhost:23790")] == [
        "127.0.0.1:2379",
        "localhost:23790",
    ]
    assert [str(e) for e in parse_endpoints(["etcd-a", "http://etcd-b:1"])] == ["etcd-a:2379", "etcd-b:1"]
    for bad, why in [
        ("", "at least one"),
        ("https://a:1,http://b:2", "mix"),
        ("ftp://h:1", "scheme"),
        ("http://u:secret@h:1", "credentials"),
        ("h:99999", "port"),
        ("h:1/path", "path"),
        # Without a scheme an endpoint is plain HTTP: next to an https:// one it would carry the password in clear.
        ("etcd1:2379,https://etcd2:2379", "mix"),
        ("https://etcd1:2379,etcd2:2379", "mix"),
        (["etcd1:2379", "https://etcd2:2379"], "mix"),
    ]:
        with pytest.raises(ValueError, match=why) as info:
            parse_endpoints(bad)
        assert "secret" not in str(info.value)
    assert [e.scheme for e in parse_endpoints("https://a:1,https://b:2")] == ["https", "https"]
    assert [e.scheme for e in parse_endpoints("a:1,http://b:2")] == [None, "http"]


def test_mixed_schemes_are_refused_by_the_elector() -> None:
    """One endpoint without a scheme next to an https:// one: refused, never plaintext to both."""
    for endpoints in ("etcd1:2379,https://etcd2:2379", ["https://etcd1:2379", "etcd2:2379"]):
        with pytest.raises(ValueError, match="mix") as info:
            EtcdElector(endpoints, username="root", password="s3cret-pw", name="/t")
        assert "https://" in str(info.value) and "s3cret-pw" not in str(info.value)


def test_degrading_is_opt_in_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """EtcdElector, new() and from_env() keep mutual exclusion unless asked; the variable is parsed strictly."""
    for variable in list(os.environ):
        if variable.startswith("AIOELECT_"):
            monkeypatch.delenv(variable)
    ep = "127.0.0.1:2379"

    def degrades(elector: Elector) -> bool:
        assert isinstance(elector._backend, EtcdBackend)
        return elector._backend.degrade_to_local

    assert not degrades(EtcdElector(ep, name="/t"))
    assert not degrades(aioelect.new(etcd=ep, name="/t"))
    assert not degrades(aioelect.from_env({"AIOELECT_ETCD_ENDPOINTS": ep}, name="/t"))
    monkeypatch.setenv("AIOELECT_ETCD_ENDPOINTS", ep)
    assert not degrades(aioelect.from_env(name="/t"))
    assert degrades(EtcdElector(ep, degrade_to_local=True, name="/t"))
    for value, expected in [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("false", False)]:
        env = {"AIOELECT_ETCD_ENDPOINTS": ep, "AIOELECT_ETCD_DEGRADE_TO_LOCAL": value}
        assert degrades(aioelect.from_env(env, name="/t")) is expected, value
        # An explicit option overrides the environment.
        assert degrades(aioelect.from_env(env, degrade_to_local=not expected, name="/t")) is not expected
    for bad in ("2", "maybe", "tru", "1 0"):
        with pytest.raises(ValueError, match="AIOELECT_ETCD_DEGRADE_TO_LOCAL"):
            aioelect.from_env({"AIOELECT_ETCD_ENDPOINTS": ep, "AIOELECT_ETCD_DEGRADE_TO_LOCAL": bad}, name="/t")
    with pytest.raises(ValueError, match="True or False"):
        EtcdElector(ep, degrade_to_local="yes", name="/t")  # type: ignore[arg-type]


def test_options_are_validated_with_reasons() -> None:
    ep = "127.0.0.1:2379"
    with pytest.raises(ValueError, match="whole number"):
        EtcdElector(ep, ttl=2.5, name="/t")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 2"):
        EtcdElector(ep, ttl=1, name="/t")
    with pytest.raises(ValueError, match="shorter than ttl"):
        EtcdElector(ep, ttl=6, renew_deadline=6, name="/t")
    with pytest.raises(ValueError, match="keep-alive interval"):
        EtcdElector(ep, ttl=6, renew_deadline=2, name="/t")
    with pytest.raises(ValueError, match="both or neither"):
        EtcdElector(ep, username="root", name="/t")
    with pytest.raises(ValueError, match="connect_timeout"):
        EtcdElector(ep, connect_timeout=0, name="/t")
    with pytest.raises(ValueError, match="printable"):
        EtcdElector(ep, name="has space")
    elector = EtcdElector(ep, ttl=6, username="root", password="s3cret-pw", name="/t")
    assert elector.renew_deadline == pytest.approx(4.0)
    assert elector._backend.renew_deadline == pytest.approx(4.0)
    assert EtcdElector(ep, ttl=6, renew_deadline=5.5, name="/t").renew_deadline == 5.5
    timing = elector._backend.describe_timing()
    assert "ttl=6s" in timing and "keep-alive every 2s" in timing and "renew_deadline=4s" in timing
    assert "s3cret-pw" not in repr(elector) + timing
    assert elector.name == "/t" and elector.backend == "etcd"


def test_a_ttl_above_what_etcd_grants_is_refused_naming_the_limit() -> None:
    ep = "127.0.0.1:2379"
    for too_long in (10**12, 9_000_000_001):
        with pytest.raises(ValueError, match="9000000000"):
            EtcdElector(ep, ttl=too_long, name="/t")
        with pytest.raises(ValueError, match="9000000000"):
            aioelect.EtcdSession(ep, ttl=too_long)
    assert EtcdElector(ep, ttl=9_000_000_000, name="/t")._backend.ttl == 9_000_000_000


async def test_etcd_refusing_a_lease_ttl_as_too_large_is_a_permanent_error(etcd: EtcdServer) -> None:
    """etcd's "too large lease TTL" is raised at once as ElectionError with the limit, never retried."""
    elector = EtcdElector(etcd.endpoints, name=unique(), ttl=TTL)
    backend = elector._backend
    assert isinstance(backend, EtcdBackend)
    try:
        start = time.monotonic()
        with pytest.raises(aioelect.PermanentBackendError, match=r"too large lease TTL.*9000000000") as raised:
            await Session.grant(backend.conn, 10**10, interval=1, keepalive_timeout=1, request_timeout=2)
        assert not isinstance(raised.value, BackendUnavailable)
        assert time.monotonic() - start < 2
    finally:
        await elector.aclose()
    assert await leases(etcd) == []


async def test_a_lease_granted_shorter_than_asked_is_refused_and_revoked(
    fresh_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The timing proof (renew deadline, keep-alive interval) assumes the ttl asked: a shorter grant is refused.

    etcd itself grants the ttl asked (or its minimum, which is longer); the
    reply's TTL is rewritten on its way to the client here, as a proxy or
    another server could answer.
    """
    elector = EtcdElector(fresh_etcd.endpoints, name=unique(), ttl=6)
    backend = elector._backend
    assert isinstance(backend, EtcdBackend)
    call = backend.conn.call

    async def shorter(what: str, request: Any, **options: Any) -> Any:
        reply = await call(what, request, **options)
        if what == "lease grant":
            reply.TTL = 3
        return reply

    backend.conn.call = shorter  # type: ignore[method-assign]
    try:
        with pytest.raises(ElectionError, match="granted a 3s lease for the 6s asked") as raised:
            await asyncio.wait_for(elector.acquire(), 10)
        assert not isinstance(raised.value, BackendUnavailable)
        assert "renew_deadline" in str(raised.value)
        assert await leases(fresh_etcd) == []
    finally:
        await elector.aclose()


# --- the election as etcd's Go package runs it -------------------------------------------------------


async def test_a_nested_election_is_refused_naming_both(etcd: EtcdServer, electors: Callable[..., EtcdElector]) -> None:
    """``X`` and ``X/invoice-cron`` share keys under ``X/``: a candidate of ``X`` that meets the other's keys refuses.

    Whether the nested election's key leads ``X`` or is the key an ``X``
    candidate would wait for, the campaign raises ElectionError naming both
    elections (and leaves no key of its own); ``leader()`` and ``observe()`` of
    ``X`` never name the nested election's leader. The nested election itself goes on.
    """
    outer = unique()
    inner = outer + "/invoice-cron"

    def refused(exc: ElectionError) -> None:
        assert not isinstance(exc, BackendUnavailable)
        assert repr(outer) in str(exc) and repr(inner) in str(exc), exc

    cron = electors("cron-a", inner)
    cron_lead = await cron.acquire()
    billing = electors("billing-a", outer)
    with pytest.raises(ElectionError) as raised:
        await billing.leader()
    refused(raised.value)
    with pytest.raises(ElectionError) as raised:
        async for _ in billing.observe():
            pass
    refused(raised.value)
    with pytest.raises(ElectionError) as raised:
        await asyncio.wait_for(billing.acquire(), 10)
    refused(raised.value)
    assert [kv["value"] for kv in await keys(etcd, outer)] == ["cron-a"]

    await cron_lead.release()
    lead = await billing.acquire()  # the first key under outer/ is its own: it leads
    cron_lead = await cron.acquire()
    with pytest.raises(ElectionError) as raised:  # its predecessor would be the nested election's key
        await asyncio.wait_for(electors("billing-b", outer).acquire(), 10)
    refused(raised.value)
    assert sorted(kv["value"] for kv in await keys(etcd, outer)) == ["billing-a", "cron-a"]
    assert await cron.leader() == "cron-a" and cron_lead.held and lead.held
    await lead.release()
    await cron_lead.release()


async def test_key_layout_token_and_leader(etcd: EtcdServer, electors: Callable[..., EtcdElector]) -> None:
    name = unique()
    a = electors("cand-a", name)
    b = electors("cand-b", name)
    assert await a.leader() is None
    lead = await a.acquire()
    (kv,) = await keys(etcd, name)
    # election.go: "{name}/" + lease id in hex, the identity as value, the lease attached.
    assert kv["key"] == f"{name}/{kv['lease']}"
    assert kv["value"] == "cand-a"
    assert kv["lease"] in await leases(etcd)
    assert lead.token == kv["create_revision"]
    assert await b.leader() == "cand-a"
    await lead.release()
    assert await keys(etcd, name) == []
    assert await b.leader() is None
    # As Go's Session: the lease serves the elector's next campaign, and goes when the elector closes.
    assert kv["lease"] in await leases(etcd)
    again = await a.acquire()
    (kv_again,) = await keys(etcd, name)
    assert kv_again["lease"] == kv["lease"] and kv_again["create_revision"] > kv["create_revision"]
    assert again.token == kv_again["create_revision"]
    await again.release()
    await a.aclose()
    assert kv["lease"] not in await leases(etcd)
    assert await keys(etcd, name) == []


async def test_takeover_after_resign_is_immediate(electors: Callable[..., EtcdElector]) -> None:
    name = unique()
    a = electors("cand-a", name)
    b = electors("cand-b", name)
    delays: list[float] = []
    for _ in range(10):
        lead_a = await a.acquire()
        follower = Follower(b)
        await asyncio.sleep(0.05)  # b is waiting on a's key
        assert not follower.won.is_set()
        released = time.monotonic()
        await lead_a.release()
        await follower.wait()
        delays.append(time.monotonic() - released)
        await follower.close()
    median = statistics.median(delays)
    log = logging.getLogger("aioelect.test")
    log.warning("etcd takeover after resign: median %.4fs max %.4fs", median, max(delays))
    assert median < 0.1, delays
    assert max(delays) < 0.5, delays


async def test_cancelled_campaign_deletes_its_key_at_once(
    etcd: EtcdServer, electors: Callable[..., EtcdElector]
) -> None:
    name = unique()
    a = electors("cand-a", name)
    b = electors("cand-b", name)
    lead = await a.acquire()
    task = asyncio.create_task(b.acquire())
    await eventually(lambda: _count(keys(etcd, name), 2), 5, "b's candidate key")
    (b_key,) = [kv for kv in await keys(etcd, name) if kv["value"] == "cand-b"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Cleanup is done when the cancelled acquire() returns: no waiting for a TTL.
    remaining = await keys(etcd, name)
    assert [kv["value"] for kv in remaining] == ["cand-a"]
    assert b_key["lease"] not in await leases(etcd)
    # b campaigns again normally after the cancellation.
    again = Follower(b)
    await asyncio.sleep(0.1)
    await lead.release()
    lead_b = await again.wait()
    assert lead_b.held and await a.leader() == "cand-b"
    await again.close()


async def _count(values: Any, n: int) -> bool:
    return len(await values) == n


async def test_nothing_leaks_after_many_cycles(fresh_etcd: EtcdServer) -> None:
    name = unique()
    baseline = len(asyncio.all_tasks())
    electors = [EtcdElector(fresh_etcd.endpoints, name=name, identity=f"c{i}", ttl=TTL) for i in range(3)]
    try:
        for cycle in range(12):
            leader, *others = electors[cycle % 3 :] + electors[: cycle % 3]
            lead = await leader.acquire()
            waiting = [asyncio.create_task(o.acquire()) for o in others]
            await eventually(lambda: _count(keys(fresh_etcd, name), 3), 5, "three candidate keys")
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            await lead.release()
            assert await keys(fresh_etcd, name) == []
    finally:
        for elector in electors:
            await elector.aclose()
    assert await leases(fresh_etcd) == []
    assert await keys(fresh_etcd, name) == []
    await asyncio.sleep(0.05)  # let finished helper tasks be collected
    assert len(asyncio.all_tasks()) == baseline, asyncio.all_tasks()


async def test_aclose_returns_once_grpc_has_ended_every_call(fresh_etcd: EtcdServer) -> None:
    """No task is left the moment aclose() returns: gRPC ends a cancelled call in a task of its own."""
    name = unique()
    baseline = {t for t in asyncio.all_tasks()}
    for _ in range(5):
        leader, waiter = (EtcdElector(fresh_etcd.endpoints, name=name, identity=f"c{i}", ttl=TTL) for i in range(2))
        lead = await leader.acquire()
        waiting = asyncio.create_task(waiter.acquire())
        await eventually(lambda: _count(keys(fresh_etcd, name), 2), 5, "two candidate keys")
        waiting.cancel()  # its watch and its key's requests are in flight
        await asyncio.gather(waiting, return_exceptions=True)
        await waiter.aclose()
        await lead.release()
        await leader.aclose()
        left = [t for t in asyncio.all_tasks() if t not in baseline and t is not asyncio.current_task()]
        assert left == [], left


async def test_lease_revoked_while_campaigning_campaigns_again(
    etcd: EtcdServer, electors: Callable[..., EtcdElector]
) -> None:
    """etcd issue 19597: the waiting candidate notices its own session ending."""
    name = unique()
    a = electors("cand-a", name)
    b = electors("cand-b", name)
    lead_a = await a.acquire()
    follower = Follower(b)
    await eventually(lambda: _count(keys(etcd, name), 2), 5, "b's candidate key")
    (b_old,) = [kv for kv in await keys(etcd, name) if kv["value"] == "cand-b"]
    await ctl(etcd, "lease", "revoke", b_old["lease"])

    async def b_back() -> bool:
        return any(kv["value"] == "cand-b" and kv["lease"] != b_old["lease"] for kv in await keys(etcd, name))

    await eventually(b_back, 5, "b campaigning again under a new lease")
    assert not follower.won.is_set()
    await lead_a.release()
    lead_b = await follower.wait()
    (kv,) = await keys(etcd, name)
    assert kv["value"] == "cand-b" and kv["lease"] in await leases(etcd) and lead_b.token == kv["create_revision"]
    await follower.close()


# --- what a keep-alive and a handoff cost the server ----------------------------------------------

_GRPC_COUNTER = re.compile(r"^grpc_server_(started|msg_received)_total\{([^}]*)\} ([0-9.e+]+)$")


async def grpc_counts(server: EtcdServer) -> dict[str, float]:
    """etcd's own gRPC counters: ``started:<method>`` (calls and streams begun), ``received:<method>`` (messages)."""

    def read() -> dict[str, float]:
        with urllib.request.urlopen(server.metrics_url, timeout=5) as reply:
            text = reply.read().decode()
        counts: dict[str, float] = {}
        for line in text.splitlines():
            match = _GRPC_COUNTER.match(line)
            if match:
                method = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))["grpc_method"]
                key = f"{'started' if match.group(1) == 'started' else 'received'}:{method}"
                counts[key] = counts.get(key, 0.0) + float(match.group(3))
        return counts

    return await anyio.to_thread.run_sync(read)


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    changed = {k for k in set(before) | set(after) if after.get(k) != before.get(k)}
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in changed}


async def test_keepalives_of_every_session_share_one_long_lived_stream(fresh_etcd: EtcdServer) -> None:
    """One LeaseKeepAlive stream per connection (Go's lessor), kept across leaderships; replies routed by lease."""
    name = unique()
    async with EtcdElector(fresh_etcd.endpoints, name=name, identity="a", ttl=TTL) as a:
        backend = a._backend
        assert isinstance(backend, EtcdBackend)
        lead = await a.acquire()
        await asyncio.sleep(1.0)  # the first keep-alive (ttl/3) has opened the stream
        before = await grpc_counts(fresh_etcd)
        # More sessions on the same connection, as a process's electors sharing it would have.
        others = [
            await Session.grant(
                backend.conn, TTL, interval=TTL / 3, keepalive_timeout=0.3, request_timeout=backend.request_timeout
            )
            for _ in range(3)
        ]
        try:
            granted = [s.confirmed_at for s in others]
            await asyncio.sleep(1.5)
            assert all(s.confirmed_at > t for s, t in zip(others, granted, strict=True)), "each lease renewed"
            # A reply with TTL 0 ends only the session whose lease it names.
            await ctl(fresh_etcd, "lease", "revoke", f"{others[0].lease_id:x}")
            with anyio.fail_after(3):
                reason = await others[0].wait_ended()
            assert "expired or revoked" in reason
            renewed = [s.confirmed_at for s in others[1:]]
            await lead.release()
            again = await a.acquire()  # the same session, the same stream
            await asyncio.sleep(1.0)
            assert not any(s.done.is_set() for s in others[1:])
            assert all(s.confirmed_at > t for s, t in zip(others[1:], renewed, strict=True))
            assert lead.token is not None and again.token is not None and again.token > lead.token
            assert again.held
            after = await grpc_counts(fresh_etcd)
        finally:
            for session in others:
                await session.close()
        changes = delta(before, after)
        # 4 sessions renewing every ttl/3 for 2.5 s: about 14 keep-alives, on no new stream.
        assert changes.get("received:LeaseKeepAlive", 0) >= 8, changes
        assert changes.get("started:LeaseKeepAlive", 0) == 0, changes
        # Release deleted the key only: the next campaign needed no new lease, and no lease was revoked.
        assert changes.get("started:LeaseGrant", 0) == 3, changes  # the three extra sessions
        assert changes.get("started:LeaseRevoke", 0) == 1, changes  # etcdctl's
        await again.release()
    assert await leases(fresh_etcd) == []


async def test_a_handoff_costs_three_transactions_one_range_and_no_lease_request(fresh_etcd: EtcdServer) -> None:
    """Two candidates passing leadership back and forth: campaign (put + predecessor read) and resign are one
    transaction each; one Range (the handover note every grant passes); a check (key stands + predecessor read,
    one or two Ranges, never a read-only transaction) only when the wait's watch cannot tell (see
    test_etcd_handover.py); no LeaseGrant/LeaseRevoke per leadership."""
    name = unique()
    electors = [EtcdElector(fresh_etcd.endpoints, name=name, identity=f"c{i}", ttl=TTL) for i in range(2)]
    tokens: list[int] = []
    holders: list[str] = []
    try:
        # Warm up: both sessions granted, both keep-alive streams open.
        for elector in electors:
            await (await elector.acquire()).release()
        before = await grpc_counts(fresh_etcd)
        started = time.monotonic()

        async def pingpong(elector: EtcdElector) -> None:
            while len(tokens) < 60:
                lead = await elector.acquire()
                assert lead.token is not None and (not tokens or lead.token > tokens[-1])
                tokens.append(lead.token)
                holders.append(elector.identity)
                await lead.release()

        with anyio.fail_after(30):
            await asyncio.gather(*(pingpong(e) for e in electors))
        took = time.monotonic() - started
        after = await grpc_counts(fresh_etcd)
    finally:
        for elector in electors:
            await elector.aclose()
    changes = delta(before, after)
    leaderships = len(tokens)
    handoffs = sum(1 for x, y in itertools.pairwise(holders) if x != y)
    log = logging.getLogger("aioelect.test")
    log.warning("etcd ping-pong: %d leaderships (%d handoffs) in %.2fs: %s", leaderships, handoffs, took, changes)
    assert handoffs >= leaderships // 2, holders
    checks = changes.get("started:Range", 0) - leaderships  # beyond the handover note, read once per grant
    assert checks >= 0, changes
    assert changes.get("started:LeaseGrant", 0) == 0 and changes.get("started:LeaseRevoke", 0) == 0, changes
    assert changes.get("started:Txn", 0) <= 2 * leaderships, changes  # the campaign's put and the resign
    # 2 to 3 requests per leadership beside the note; a few more when a watch shortcut reads again.
    assert changes.get("started:Txn", 0) + checks <= 3.5 * leaderships, changes
    assert await leases(fresh_etcd) == []


async def test_a_predecessor_gone_before_its_watch_starts_is_read_again_not_waited_for(
    etcd: EtcdServer, electors: Callable[..., EtcdElector]
) -> None:
    """A watch that starts at or below etcd's current revision gets its events from etcd's slow path (a
    background loop, up to 100 ms late): when the store moved since the read, read again at once instead."""
    name = unique()
    elector = electors("x", name)
    backend = elector._backend
    assert isinstance(backend, EtcdBackend)
    predecessor = f"{name}/predecessor"
    await ctl(etcd, "put", predecessor, "p")
    kv, read_at = await backend.first_candidate()
    assert kv is not None and bytes(kv.key).decode() == predecessor
    await ctl(etcd, "del", predecessor)  # gone between our read and our watch
    with anyio.fail_after(2):
        waited = await backend._wait_turn(predecessor.encode(), read_at, shortcut=True)
        assert waited.turn is Turn.SKIPPED and waited.watch is None
        # Not twice in a row: the next wait sees the deletion through the watch itself (it is never missed).
        waited = await backend._wait_turn(predecessor.encode(), read_at, shortcut=False)
        assert waited.turn is Turn.READ_AGAIN and waited.watch is None


async def test_lease_revoked_between_campaigns_campaigns_with_a_new_one(
    etcd: EtcdServer, electors: Callable[..., EtcdElector]
) -> None:
    name = unique()
    a = electors("cand-a", name)
    lead = await a.acquire()
    (kv,) = await keys(etcd, name)
    await lead.release()
    await ctl(etcd, "lease", "revoke", kv["lease"])  # the kept session's lease, before its next keep-alive
    with anyio.fail_after(5):
        again = await a.acquire()
    (kv_again,) = await keys(etcd, name)
    assert again.held and kv_again["lease"] != kv["lease"] and kv_again["lease"] in await leases(etcd)
    assert again.token == kv_again["create_revision"]
    await again.release()


async def test_an_elector_that_reached_etcd_never_degrades(
    fresh_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Opted in, an elector degrades only if etcd never answered it: not after a leadership, nor after leader()."""
    caplog.set_level(logging.WARNING, logger="aioelect")
    name = unique()
    options: dict[str, Any] = {"name": name, "ttl": TTL, "connect_timeout": 1, "degrade_to_local": True}
    async with (
        EtcdElector(fresh_etcd.endpoints, identity="led-before", **options) as led,
        EtcdElector(fresh_etcd.endpoints, identity="only-asked", **options) as asked,
    ):
        await (await led.acquire()).release()
        assert await asked.leader() is None
        await anyio.to_thread.run_sync(fresh_etcd.stop)
        followers = [Follower(led), Follower(asked)]
        await asyncio.sleep(3.0)  # several failed lease grants each
        try:
            assert not any(f.won.is_set() for f in followers), "an elector that reached etcd led locally"
            assert not any("mutual exclusion" in r.getMessage() for r in caplog.records)
        finally:
            for follower in followers:
                await follower.close()


# --- leader() and observe() ------------------------------------------------------------------


async def test_a_dead_endpoint_is_passed_over(etcd: EtcdServer, caplog: pytest.LogCaptureFixture) -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with EtcdElector([dead, *etcd.endpoints], name=unique(), identity="x", ttl=TTL, connect_timeout=1) as elector:
        with anyio.fail_after(5):
            lead = await elector.acquire()
        assert isinstance(lead.token, int), "a real etcd leadership, not a degraded one"
        assert await elector.leader() == "x"
        await lead.release()
    assert not any("WITHOUT mutual exclusion" in r.getMessage() for r in caplog.records)


async def test_a_compacted_watch_start_is_reported_for_resync(
    etcd: EtcdServer, electors: Callable[..., EtcdElector]
) -> None:
    """A watch from a compacted revision raises Compacted (a Transient): observe() and the
    leader's key watch then read again instead of skipping the lost events."""
    from aioelect.backends.etcd._failures import Compacted

    name = unique()
    elector = electors("x", name)
    lead = await elector.acquire()
    await lead.release()
    status = json.loads(await ctl(etcd, "endpoint", "status", "-w", "json"))
    revision = int(status[0]["Status"]["header"]["revision"])
    await ctl(etcd, "compact", str(revision))
    backend = elector._backend
    assert isinstance(backend, EtcdBackend)
    with pytest.raises(Compacted), anyio.fail_after(5):
        # etcd acknowledges the watch, then cancels it for the compaction.
        async with backend.conn.watch(backend.prefix, start_revision=revision - 1) as stream:
            await stream.next()


async def test_leader_unreachable_raises_backend_unavailable() -> None:
    async with EtcdElector([f"127.0.0.1:{free_port()}"], connect_timeout=1, name="/t") as elector:
        with anyio.fail_after(5), pytest.raises(BackendUnavailable):
            await elector.leader()


# --- interoperability with etcdctl elect (etcd's Go concurrency package) ----------------------------


class EtcdctlElect:
    """``etcdctl elect NAME PROPOSAL`` as a subprocess: prints key and value once elected, resigns on SIGINT."""

    def __init__(self, server: EtcdServer, name: str, proposal: str) -> None:
        self.argv = [require_binary("etcdctl"), f"--endpoints={','.join(server.endpoints)}", "elect", name, proposal]
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self.elected = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> EtcdctlElect:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "ETCDCTL_API": "3"},
        )
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.lines.append(line.decode().strip())
            if len(self.lines) >= 2:
                self.elected.set()

    async def resign(self) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)
            with anyio.fail_after(10):
                await self.proc.wait()

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


async def test_interop_etcdctl_leads_first(etcd: EtcdServer, electors: Callable[..., EtcdElector]) -> None:
    name = unique()
    ours = electors("ours", name)
    async with EtcdctlElect(etcd, name, "go-proposal") as go:
        with anyio.fail_after(10):
            await go.elected.wait()
        assert go.lines[0].startswith(name + "/") and go.lines[1] == "go-proposal"
        assert await ours.leader() == "go-proposal"
        follower = Follower(ours)
        await asyncio.sleep(0.5)
        assert not follower.won.is_set(), "we must not lead while etcdctl does"
        resigned = time.monotonic()
        await go.resign()
        await follower.wait()
        assert time.monotonic() - resigned < 2.0
        assert await ours.leader() == "ours"
        await follower.close()


async def test_interop_we_lead_first(etcd: EtcdServer, electors: Callable[..., EtcdElector]) -> None:
    name = unique()
    ours = electors("ours", name)
    lead = await ours.acquire()
    async with EtcdctlElect(etcd, name, "go-proposal") as go:
        await asyncio.sleep(0.8)
        assert not go.elected.is_set(), "etcdctl must not lead while we do"
        queue = sorted(await keys(etcd, name), key=lambda kv: kv["create_revision"])
        assert [kv["value"] for kv in queue] == ["ours", "go-proposal"]
        released = time.monotonic()
        await lead.release()
        with anyio.fail_after(5):
            await go.elected.wait()
        assert time.monotonic() - released < 1.0
        assert await ours.leader() == "go-proposal"
        await go.resign()
    assert await keys(etcd, name) == []


# --- degrading, credentials --------------------------------------------------------------------


async def test_degrade_to_local_when_etcd_is_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aioelect")
    elector = EtcdElector(
        [f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"],
        identity="alone",
        ttl=TTL,
        connect_timeout=1,
        degrade_to_local=True,
        name="/t",
    )
    async with elector:
        with anyio.fail_after(5):
            lead = await elector.acquire()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("WITHOUT mutual exclusion" in m and "every instance" in m for m in warnings), warnings
        assert lead.token is None
        await asyncio.sleep(elector.renew_deadline + 0.5)
        assert lead.held, "a degraded leadership lasts while etcd does not answer"
        assert await elector.leader() == "alone"
        await lead.release()
        assert not lead.lost


async def test_default_never_degrades_when_etcd_is_unreachable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the opt-in, EtcdElector, new() and leadership() stay followers while no endpoint answers."""
    caplog.set_level(logging.WARNING, logger="aioelect")
    for variable in list(os.environ):
        if variable.startswith("AIOELECT_"):
            monkeypatch.delenv(variable)
    down = f"127.0.0.1:{free_port()}"
    options: dict[str, Any] = {"name": "/t", "ttl": TTL, "connect_timeout": 1}
    async with EtcdElector(down, **options) as direct, aioelect.new(etcd=down, **options) as built:
        for elector in (direct, built):
            with anyio.move_on_after(2.0) as scope:
                await elector.acquire()
            assert scope.cancelled_caught, f"{elector!r} led without etcd"
    with anyio.move_on_after(2.0) as scope:
        async with aioelect.leadership(etcd=down, **options):
            raise AssertionError("leadership() led without etcd")
    assert scope.cancelled_caught
    assert not any("mutual exclusion" in r.getMessage() for r in caplog.records)


async def test_a_degraded_leadership_ends_as_soon_as_etcd_answers(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Leading locally lasts only until etcd answers; the next campaign is on etcd, and never degrades again."""
    caplog.set_level(logging.WARNING, logger="aioelect")
    with TCPProxy(etcd.host, etcd.port) as proxy:
        proxy.drop()
        async with EtcdElector(
            [proxy.endpoint], name=unique(), identity="cut-off", ttl=TTL, connect_timeout=1, degrade_to_local=True
        ) as elector:
            with anyio.fail_after(5):
                degraded = await elector.acquire()
            assert degraded.token is None
            await asyncio.sleep(elector.renew_deadline + 0.2)
            assert degraded.held
            healed = time.monotonic()
            proxy.heal()
            with anyio.fail_after(5):
                await degraded.wait_lost()
            took = time.monotonic() - healed
            assert "etcd answered" in (degraded.lost_reason or ""), degraded.lost_reason
            assert degraded.lost_kind is aioelect.LossKind.RELEASED_BY_SERVER
            assert took < 3.0, f"the degraded leadership outlived etcd's answer by {took:.2f}s"
            await degraded.release()
            with anyio.fail_after(5):
                lead = await elector.acquire()
            assert isinstance(lead.token, int), "the next leadership is on etcd"
            await lead.release()
            proxy.drop()
            follower = Follower(elector)
            await asyncio.sleep(2.0)
            assert not follower.won.is_set(), "etcd answered once: the elector never degrades again"
            await follower.close()
    assert sum("WITHOUT mutual exclusion" in r.getMessage() for r in caplog.records) == 1, "one warning, one degrade"


async def test_no_degrade_waits_for_etcd_then_leads(fresh_etcd: EtcdServer) -> None:
    await anyio.to_thread.run_sync(fresh_etcd.stop)
    elector = EtcdElector(
        fresh_etcd.endpoints, name=unique(), identity="patient", ttl=TTL, degrade_to_local=False, connect_timeout=1
    )
    async with elector:
        follower = Follower(elector)
        await asyncio.sleep(1.5)
        assert not follower.won.is_set(), "without degrade_to_local a candidate stays a follower while etcd is down"
        with pytest.raises(BackendUnavailable):
            await elector.leader()
        await anyio.to_thread.run_sync(fresh_etcd.start)
        lead = await follower.wait(timeout=10)
        assert lead.held and isinstance(lead.token, int)
        assert await elector.leader() == "patient"
        await follower.close()


async def test_credentials() -> None:
    # Auth tokens that expire after 1 s idle, so that a leadership outlives its token.
    server = EtcdServer(extra_args=["--auth-token-ttl=1"])
    await anyio.to_thread.run_sync(server.start)
    try:
        await _check_credentials(server)
    finally:
        await anyio.to_thread.run_sync(server.cleanup)


async def _check_credentials(server: EtcdServer) -> None:
    await ctl(server, "user", "add", "root:right-pw")
    await ctl(server, "auth", "enable")
    name = unique()
    for degrade in (True, False):
        async with EtcdElector(
            server.endpoints, name=name, username="root", password="wrong-pw", degrade_to_local=degrade
        ) as elector:
            started = time.monotonic()
            with pytest.raises(aioelect.PermanentBackendError, match="rejected the credentials") as info:
                await elector.acquire()
            assert time.monotonic() - started < 2.0
            assert "wrong-pw" not in str(info.value)
            with pytest.raises(ElectionError, match="credentials"):
                await elector.leader()
    async with EtcdElector(server.endpoints, name=name) as anonymous:
        with pytest.raises(ElectionError, match="authentication enabled"):
            await anonymous.acquire()
    async with EtcdElector(server.endpoints, name=name, username="root", password="right-pw", ttl=TTL) as good:
        lead = await good.acquire()
        assert await good.leader() == good.identity
        await asyncio.sleep(2.5)  # the token expires meanwhile; keep-alives go on
        assert lead.held
        assert await good.leader() == good.identity
        await lead.release()
        assert await good.leader() is None
        again = await good.acquire()
        await again.release()
    # A refusal is an answer: an elector that etcd refused never degrades afterwards, opted in or not.
    async with EtcdElector(
        server.endpoints, name=name, username="root", password="wrong-pw", degrade_to_local=True, connect_timeout=1
    ) as refused:
        with pytest.raises(ElectionError, match="rejected the credentials"):
            await refused.acquire()
        await anyio.to_thread.run_sync(server.stop)
        with anyio.move_on_after(2.0) as scope:
            await refused.acquire()
        assert scope.cancelled_caught, "an elector that etcd had refused led locally"
