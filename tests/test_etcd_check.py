"""The etcd campaign's check as Range reads at one revision: its answer in every state of the election; keys_only
still returns a key's lease and create revision; a compaction between the two reads is a clean retry; the leader
deleted between the two reads neither hangs nor makes two leaders; no read-only transaction anywhere (etcd 3.5.0 to
3.5.4 panic when the client of one goes away while it is applied).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest
from aetcd import rpc

from aioelect import EtcdElector, PermanentBackendError
from aioelect.backends.etcd._backend import EtcdBackend
from aioelect.backends.etcd._election import KeyLost
from aioelect.backends.etcd._failures import SessionEnded, Transient
from aioelect.core._elector import backend_of

from .backends import Follower
from .harness import EtcdServer
from .test_etcd import unique

pytestmark = pytest.mark.timeout(90)


async def _call(backend: EtcdBackend, what: str, request: Callable[[Any], Awaitable[Any]]) -> Any:
    return await backend.conn.call(what, request, timeout=5)


async def put(backend: EtcdBackend, key: bytes, value: bytes = b"x", lease: int = 0) -> int:
    reply = await _call(
        backend,
        "test put",
        lambda ch: ch.kv.Put(rpc.PutRequest(key=key, value=value, lease=lease), metadata=ch.metadata),
    )
    return int(reply.header.revision)


async def delete(backend: EtcdBackend, key: bytes) -> int:
    reply = await _call(
        backend, "test delete", lambda ch: ch.kv.DeleteRange(rpc.DeleteRangeRequest(key=key), metadata=ch.metadata)
    )
    return int(reply.header.revision)


async def compact(backend: EtcdBackend, revision: int) -> None:
    await _call(
        backend,
        "test compact",
        lambda ch: ch.kv.Compact(rpc.CompactionRequest(revision=revision, physical=True), metadata=ch.metadata),
    )


async def outcome(check: Callable[..., Awaitable[tuple[bytes | None, int]]], backend: EtcdBackend, *args: Any) -> Any:
    """What a check answered: the predecessor and the leader it recorded, or the kind of exception it raised."""
    try:
        predecessor, _ = await check(*args)
    except (KeyLost, SessionEnded, PermanentBackendError) as exc:
        return type(exc).__name__
    view = backend.sight.current
    return ("ok", predecessor, None if view is None else (view.leader, view.identity, view.predecessor))


class World:
    """One election (a fresh name), our candidate key put by the backend under its session, raw keys beside it."""

    def __init__(self, elector: EtcdElector) -> None:
        self.elector = elector
        backend = backend_of(elector)
        assert isinstance(backend, EtcdBackend)
        self.backend = backend

    async def start(self) -> None:
        self.session = await self.backend.leases.live()
        self.key = self.backend.prefix + f"{self.session.lease_id:x}".encode()

    def other(self, label: str) -> bytes:
        return self.backend.prefix + label.encode()

    async def candidate(self) -> int:
        """Our key put as a campaign puts it (raw: the campaign's own put would refuse a nested key before it)."""
        self.revision = await put(self.backend, self.key, b"me", self.session.lease_id)
        return self.revision

    async def answer(self) -> Any:
        b = self.backend
        return await outcome(b._check, b, self.session, self.key, self.revision)


@pytest.fixture
async def world(etcd: EtcdServer) -> AsyncIterator[World]:
    elector = EtcdElector(etcd.endpoints, name=unique(), identity="me", ttl=5)
    w = World(elector)
    await w.start()
    try:
        yield w
    finally:
        await elector.aclose()


async def _scenario(w: World, name: str) -> Any:
    b = w.backend
    if name == "alone":
        await w.candidate()
    elif name == "one-before":
        await put(b, w.other("a"))
        await w.candidate()
    elif name == "several-before":
        for label in ("a", "b", "c"):
            await put(b, w.other(label))
        await w.candidate()
    elif name == "several-before-and-after":
        for label in ("a", "b"):
            await put(b, w.other(label))
        await w.candidate()
        for label in ("y", "z"):
            await put(b, w.other(label))
    elif name == "leader-with-keys-after":
        await w.candidate()
        await put(b, w.other("y"))
    elif name == "predecessor-gone":
        await put(b, w.other("a"))
        await put(b, w.other("b"))
        await w.candidate()
        await delete(b, w.other("b"))
    elif name == "all-before-gone-keys-after":
        await put(b, w.other("a"))
        await w.candidate()
        await put(b, w.other("z"))
        await delete(b, w.other("a"))
    elif name == "ours-deleted":
        await put(b, w.other("a"))
        await w.candidate()
        await delete(b, w.key)
    elif name == "ours-deleted-alone":
        await w.candidate()
        await delete(b, w.key)
    elif name == "ours-deleted-keys-after":
        await w.candidate()
        await put(b, w.other("z"))
        await delete(b, w.key)
    elif name == "ours-reput-new-create":
        await put(b, w.other("a"))
        await w.candidate()
        await delete(b, w.key)
        await put(b, w.key, b"me", w.session.lease_id)
    elif name == "ours-reput-new-create-alone":
        await w.candidate()
        await delete(b, w.key)
        await put(b, w.key, b"me", w.session.lease_id)
    elif name == "ours-reput-new-create-after-others":
        await w.candidate()
        await put(b, w.other("z"))
        await delete(b, w.key)
        await put(b, w.key, b"me", w.session.lease_id)
    elif name == "ours-reput-no-lease":
        await put(b, w.other("a"))
        await w.candidate()
        await put(b, w.key, b"me", 0)
    elif name == "ours-reput-no-lease-leader":
        await w.candidate()
        await put(b, w.key, b"me", 0)
    elif name == "ours-reput-other-lease":
        grant = await _call(
            b, "test grant", lambda ch: ch.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=30), metadata=ch.metadata)
        )
        await put(b, w.other("a"))
        await w.candidate()
        await put(b, w.key, b"me", int(grant.ID))
    elif name == "nested-predecessor":
        await put(b, w.other("nested/1"))
        await w.candidate()
    elif name == "nested-leader":
        await put(b, w.other("nested/1"))
        await put(b, w.other("a"))
        await w.candidate()
    elif name == "nested-after":
        await put(b, w.other("a"))
        await w.candidate()
        await put(b, w.other("nested/1"))
    elif name == "nested-after-ours-deleted":
        await put(b, w.other("a"))
        await w.candidate()
        await put(b, w.other("nested/1"))
        await delete(b, w.key)
    else:  # pragma: no cover
        raise AssertionError(name)
    return await w.answer()


async def test_the_check_answers_in_every_state_of_the_election(etcd: EtcdServer) -> None:
    """The predecessor, or the exception: what the read-only transaction it replaced answered, state by state."""
    expected = {
        "alone": None,
        "one-before": b"a",
        "several-before": b"c",
        "several-before-and-after": b"b",
        "leader-with-keys-after": None,
        "predecessor-gone": b"a",
        "all-before-gone-keys-after": None,
        "ours-deleted": "KeyLost",
        "ours-deleted-alone": "KeyLost",
        "ours-deleted-keys-after": "KeyLost",
        "ours-reput-new-create": "KeyLost",
        "ours-reput-new-create-alone": "KeyLost",
        "ours-reput-new-create-after-others": "KeyLost",
        "ours-reput-no-lease": "KeyLost",
        "ours-reput-no-lease-leader": "KeyLost",
        "ours-reput-other-lease": "KeyLost",
        "nested-predecessor": "PermanentBackendError",
        "nested-leader": "PermanentBackendError",
        "nested-after": b"a",
        "nested-after-ours-deleted": "KeyLost",
    }
    for name, want in expected.items():
        elector = EtcdElector(etcd.endpoints, name=unique(), identity="me", ttl=5)
        w = World(elector)
        try:
            await w.start()
            new = await _scenario(w, name)
            got = new[1] if isinstance(new, tuple) else new
            if isinstance(want, bytes):
                want = w.other(want.decode())
            assert got == want, f"{name}: {new}"
        finally:
            await elector.aclose()


async def test_our_lease_revoked_is_the_session_ended(world: World) -> None:
    b = world.backend
    await put(b, world.other("a"))
    await world.candidate()
    await _call(
        b,
        "test revoke",
        lambda ch: ch.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=world.session.lease_id), metadata=ch.metadata),
    )
    with pytest.raises((SessionEnded, Transient)) as raised, anyio.fail_after(10):
        await b._check(world.session, world.key, world.revision)
    if isinstance(raised.value, Transient):
        assert raised.value.lease_gone, raised.value


async def test_keys_only_still_returns_lease_and_create_revision(world: World) -> None:
    """If etcd dropped `lease` from a keys_only range, every non-leader check would be KeyLost."""
    b = world.backend
    await put(b, world.other("a"))
    revision = await world.candidate()
    request = b._last_created(before=revision + 1, limit=2)
    assert request.keys_only
    reply = await _call(b, "test range", lambda ch: ch.kv.Range(request, metadata=ch.metadata))
    assert [bytes(kv.key) for kv in reply.kvs] == [world.key, world.other("a")]
    assert int(reply.kvs[0].lease) == world.session.lease_id
    assert int(reply.kvs[0].create_revision) == revision
    assert reply.kvs[1].create_revision < revision and not reply.kvs[0].value


async def test_a_compaction_between_the_two_reads_is_a_transient_never_a_wrong_answer(world: World) -> None:
    b = world.backend
    await put(b, world.other("a"))
    await world.candidate()
    read = b._read
    calls = 0

    async def compacting(what: str, request: Any) -> Any:
        nonlocal calls
        calls += 1
        reply = await read(what, request)
        if calls == 1:
            latest = await put(b, world.other("zz-after"))  # created after ours: never the answer
            await compact(b, latest)
        return reply

    b._read = compacting  # type: ignore[method-assign]
    try:
        with pytest.raises(Transient) as raised, anyio.fail_after(10):
            await b._check(world.session, world.key, world.revision)
        assert "compacted" in str(raised.value) and not raised.value.lease_gone, raised.value
        assert calls == 2
    finally:
        del b._read
    assert (await b._check(world.session, world.key, world.revision))[0] == world.other("a")


async def test_a_campaign_whose_check_meets_a_compaction_retries_and_leads(etcd: EtcdServer) -> None:
    """A leads, B and C wait; B's key is deleted so C checks; the check's pinned revision is compacted between its
    two reads. C must retry (a Transient), keep waiting behind A, and lead once A resigns, in bounded time."""
    name = unique()
    a = EtcdElector(etcd.endpoints, name=name, identity="a", ttl=5)
    b = EtcdElector(etcd.endpoints, name=name, identity="b", ttl=5)
    c = EtcdElector(etcd.endpoints, name=name, identity="c", ttl=5)
    cb = backend_of(c)
    assert isinstance(cb, EtcdBackend)
    read = cb._read
    compactions = 0
    follower_c: Follower | None = None

    async def compacting(what: str, request: Any) -> Any:
        nonlocal compactions
        reply = await read(what, request)
        if request.sort_order == rpc.RangeRequest.ASCEND and compactions < 2:  # the leader read: compact past it
            compactions += 1
            await compact(cb, await put(cb, b"/aioelect-test-compact/" + secrets.token_hex(4).encode()))
        return reply

    try:
        lead_a = await a.acquire()
        task_b = asyncio.get_running_loop().create_task(b.acquire())
        await asyncio.sleep(0.3)
        follower_c = Follower(c)  # holds the leadership in its own task: it ends with the task that acquired it
        await asyncio.sleep(0.3)
        cb._read = compacting  # type: ignore[method-assign]
        task_b.cancel()  # B withdraws: C's predecessor is gone, C checks
        with pytest.raises(asyncio.CancelledError):
            await task_b
        with anyio.fail_after(15):
            while compactions < 2:
                await asyncio.sleep(0.05)
        assert not follower_c.won.is_set(), "C led while A leads"
        assert lead_a.held and await a.leader() == "a"
        await lead_a.release()
        lead_c = await follower_c.wait(15)
        assert lead_c.held and await c.leader() == "c"
    finally:
        if follower_c is not None:
            await follower_c.close()
        for e in (a, b, c):
            await e.aclose()


async def test_the_leader_deleted_between_the_two_reads_neither_hangs_nor_leads_twice(etcd: EtcdServer) -> None:
    """A leads, B then C wait; B withdraws so C checks; between C's leader read (A leads) and its second read, A's
    key is deleted (A's lease revoked from outside). The second read is pinned to the first's revision: C must see A
    as its predecessor as of then, then lead off the watch, and A must see its loss."""
    name = unique()
    a = EtcdElector(etcd.endpoints, name=name, identity="a", ttl=5)
    b = EtcdElector(etcd.endpoints, name=name, identity="b", ttl=5)
    c = EtcdElector(etcd.endpoints, name=name, identity="c", ttl=5)
    ab, cb = backend_of(a), backend_of(c)
    assert isinstance(ab, EtcdBackend) and isinstance(cb, EtcdBackend)
    read = cb._read
    deleted: list[int] = []
    a_key = b""
    follower_c: Follower | None = None

    async def deleting(what: str, request: Any) -> Any:
        reply = await read(what, request)
        if request.sort_order == rpc.RangeRequest.ASCEND and not deleted:
            deleted.append(await delete(cb, a_key))
        return reply

    try:
        lead_a = await a.acquire()
        a_key = ab.prefix + f"{(await ab.leases.live()).lease_id:x}".encode()
        task_b = asyncio.get_running_loop().create_task(b.acquire())
        await asyncio.sleep(0.3)
        follower_c = Follower(c)  # holds the leadership in its own task: it ends with the task that acquired it
        await asyncio.sleep(0.3)
        cb._read = deleting  # type: ignore[method-assign]
        task_b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task_b
        lead_c = await follower_c.wait(10)
        assert deleted, "the leader read never ran"
        with anyio.fail_after(10):
            while lead_a.held:
                await asyncio.sleep(0.05)
        assert lead_c.held and await c.leader() == "c"
    finally:
        if follower_c is not None:
            await follower_c.close()
        for e in (a, b, c):
            await e.aclose()


def test_no_read_only_transaction_is_left_in_the_library() -> None:
    """Every TxnRequest the library builds has a write in a branch (etcd decides read-only over both branches)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    offenders = []
    for folder in ("aioelect", "soak", "bench"):
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "TxnRequest":
                    text = ast.unparse(node)
                    if "request_put" not in text and "request_delete_range" not in text:
                        offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders
