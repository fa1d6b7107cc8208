"""The next in line leads from its watch's revisions, without a read, and never on a key that is gone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import anyio
import pytest
from aetcd import rpc

from aioelect import EtcdElector, Leadership
from aioelect.backends.etcd import EtcdBackend
from aioelect.backends.etcd._election import Sight, View
from aioelect.backends.etcd._failures import Failure, Transient

from .harness import EtcdServer
from .test_etcd import TTL, delta, eventually, grpc_counts, keys, leases, unique

pytestmark = pytest.mark.timeout(60)


async def _delete(elector: EtcdElector, *names: str) -> None:
    """Delete ``names`` in one transaction (one revision), through ``elector``'s connection."""
    backend = elector._backend
    assert isinstance(backend, EtcdBackend)
    request = rpc.TxnRequest(
        success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=n.encode())) for n in names]
    )
    await backend.conn.call("test delete", lambda ch: ch.kv.Txn(request, metadata=ch.metadata), timeout=5)


async def _waiting(server: EtcdServer, name: str) -> list[str]:
    """Wait until two keys stand (leader, waiter); return them in create order."""
    await eventually(lambda: _has(server, name, 2), 5, "a leader and a waiter")
    return [kv["key"] for kv in sorted(await keys(server, name), key=lambda kv: kv["create_revision"])]


async def _has(server: EtcdServer, name: str, n: int) -> bool:
    return len(await keys(server, name)) == n


async def _lead_on_a_standing_key(server: EtcdServer, name: str, lead: Leadership, identity: str = "b") -> None:
    (kv,) = await keys(server, name)
    assert kv["value"] == identity and kv["create_revision"] == lead.token


@contextlib.asynccontextmanager
async def _leader_and_waiter(
    server: EtcdServer,
) -> AsyncIterator[tuple[str, EtcdElector, Leadership, list[Leadership]]]:
    """(name, a, a's leadership, [b's leadership once it leads]), b waiting behind a; everything closed after."""
    name = unique()
    async with (
        EtcdElector(server.endpoints, name=name, identity="a", ttl=TTL) as a,
        EtcdElector(server.endpoints, name=name, identity="b", ttl=TTL) as b,
    ):
        first = await a.acquire()
        got: list[Leadership] = []

        async def campaign() -> None:
            got.append(await b.acquire())
            await anyio.sleep_forever()

        async with anyio.create_task_group() as tg:
            tg.start_soon(campaign)
            yield name, a, first, got
            tg.cancel_scope.cancel()
        await first.release()
    assert await leases(server) == []


async def test_a_waiter_whose_key_goes_with_its_predecessor_does_not_lead_on_it(fresh_etcd: EtcdServer) -> None:
    """Both keys deleted in one revision: the waiter's watch sees its own key go too, so it campaigns again."""
    async with _leader_and_waiter(fresh_etcd) as (name, a, first, got):
        leader_key, waiter_key = await _waiting(fresh_etcd, name)
        await _delete(a, leader_key, waiter_key)
        await eventually(lambda: got, 10, "b leads")
        await _lead_on_a_standing_key(fresh_etcd, name, got[0])
        assert got[0].held
        await eventually(lambda: first.lost_reason is not None, 5, "a's loss")


async def test_a_waiter_whose_key_was_deleted_does_not_lead_when_its_predecessor_goes(
    fresh_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aioelect")
    async with _leader_and_waiter(fresh_etcd) as (name, a, first, got):
        _, waiter_key = await _waiting(fresh_etcd, name)
        await _delete(a, waiter_key)
        await asyncio.sleep(0.2)
        await first.release()
        await eventually(lambda: got, 10, "b leads")
        await _lead_on_a_standing_key(fresh_etcd, name, got[0])
        assert any("candidate key was deleted" in r.getMessage() for r in caplog.records)


async def test_a_handover_to_the_next_in_line_reads_nothing(fresh_etcd: EtcdServer) -> None:
    """Leader releases, the next in line leads: the resign is the only request (its watch tells the rest)."""
    async with _leader_and_waiter(fresh_etcd) as (name, _, first, got):
        await _waiting(fresh_etcd, name)
        await asyncio.sleep(0.3)  # b's watch is created
        before = await grpc_counts(fresh_etcd)
        await first.release()
        await eventually(lambda: got, 10, "b leads")
        await asyncio.sleep(0.1)  # b settles as leader (its watch goes on, no read)
        after = await grpc_counts(fresh_etcd)
        changes = delta(before, after)
        assert changes.get("started:Txn", 0) == 1, changes  # the resign
        # One read: the handover note, which every grant passes before it becomes a leadership.
        assert changes.get("started:Range", 0) == 1, changes
        await _lead_on_a_standing_key(fresh_etcd, name, got[0])


async def test_the_watch_the_next_in_line_waited_on_watches_its_leadership(fresh_etcd: EtcdServer) -> None:
    """After a handover without a read, the leadership is watched on the same watch: deleting the key ends it."""
    async with _leader_and_waiter(fresh_etcd) as (name, a, first, got):
        await _waiting(fresh_etcd, name)
        await asyncio.sleep(0.3)
        before = await grpc_counts(fresh_etcd)
        await first.release()
        await eventually(lambda: got, 10, "b leads")
        (kv,) = await keys(fresh_etcd, name)
        await asyncio.sleep(0.2)
        assert got[0].held
        assert delta(before, await grpc_counts(fresh_etcd)).get("started:Watch", 0) == 0  # no new watch stream
        await _delete(a, kv["key"])
        await eventually(lambda: not got[0].held, 5, "b's loss")
        assert "deleted" in (got[0].lost_reason or "")


async def test_the_third_in_line_leads_without_a_read_once_the_keys_before_it_went(fresh_etcd: EtcdServer) -> None:
    """a leads, b and c wait; a goes (c's leader watch sees b lead), then b goes: c leads on its watch alone."""
    name = unique()
    electors = [EtcdElector(fresh_etcd.endpoints, name=name, identity=i, ttl=TTL) for i in "abc"]
    got: dict[str, Leadership] = {}
    try:
        got["a"] = await electors[0].acquire()
        async with anyio.create_task_group() as tg:

            async def campaign(elector: EtcdElector) -> None:
                got[elector.identity] = await elector.acquire()
                await anyio.sleep_forever()

            for count, elector in enumerate(electors[1:], start=2):
                tg.start_soon(campaign, elector)
                await eventually(lambda n=count: _has(fresh_etcd, name, n), 5, "its key")
            await got["a"].release()
            await eventually(lambda: "b" in got, 10, "b leads")
            await asyncio.sleep(0.3)  # c's leader watch reads who leads now
            before = await grpc_counts(fresh_etcd)
            await got["b"].release()
            await eventually(lambda: "c" in got, 10, "c leads")
            changes = delta(before, await grpc_counts(fresh_etcd))
            # One read: the handover note, which every grant passes before it becomes a leadership.
            assert changes.get("started:Txn", 0) == 1 and changes.get("started:Range", 0) == 1, changes
            await _lead_on_a_standing_key(fresh_etcd, name, got["c"], "c")
            tg.cancel_scope.cancel()
    finally:
        for elector in electors:
            await elector.aclose()
    assert await leases(fresh_etcd) == []


class _LateLeaderReads:
    """Network-like delays on one waiter's connection, at its client side (etcd itself answers as usual).

    Its first leader watch is cancelled as etcd cancels a watch; its first
    read of the leader (or of the candidates ahead of it) reaches it only at :meth:`deliver`
    (etcd read it at once);
    every later one only when the test ends (:meth:`end`).
    """

    def __init__(self, backend: EtcdBackend) -> None:
        self.taken = asyncio.Event()
        self._first = asyncio.Event()
        self._later = asyncio.Event()
        self._reads = 0
        self._cancelled = False
        conn = backend.conn
        call, watch = conn.call, conn.watch

        async def late_call(what: str, request: Any, **options: Any) -> Any:
            reply = await call(what, request, **options)
            if what in ("read leader", "read candidates ahead"):
                self._reads += 1
                if self._reads == 1:
                    self.taken.set()
                await (self._first if self._reads == 1 else self._later).wait()
            return reply

        @contextlib.asynccontextmanager
        async def cancelled_watch(key: bytes, **options: Any) -> AsyncIterator[Any]:
            # The watch of the leader's key, or of the candidates ahead (the prefix, deletes included).
            ranged = options.get("range_end") is not None
            leader_watch = not options.get("no_delete") if ranged else not options.get("no_put")
            if leader_watch and not self._cancelled:
                self._cancelled = True
                raise Transient("etcd cancelled the watch", Failure.REFUSED)
            async with watch(key, **options) as stream:
                yield stream

        conn.call = late_call  # type: ignore[method-assign]
        conn.watch = cancelled_watch  # type: ignore[method-assign]

    def deliver(self) -> None:
        self._first.set()

    def end(self) -> None:
        self._first.set()
        self._later.set()


async def test_a_late_leader_read_taken_before_our_key_was_put_again_proves_nothing(fresh_etcd: EtcdServer) -> None:
    """A waiter's late read of who led, taken before its key was deleted and put again, never makes it leader.

    P leads, Q and W wait. W's leader read (P leads) is late. W's key is
    deleted by hand and W puts the same key bytes again, after P released
    (Q leads) and campaigned again on its kept session (same key bytes,
    behind W's old key, before W's new one). Then the late read lands, and P
    gives up: its key is deleted. W must not lead on that deletion: Q does.
    """
    name = unique()
    p, q, w = (EtcdElector(fresh_etcd.endpoints, name=name, identity=i, ttl=5) for i in "pqw")
    got: dict[str, Leadership] = {}
    late = _LateLeaderReads(w._backend)  # type: ignore[arg-type]

    async def campaign(elector: EtcdElector) -> None:
        got[elector.identity] = await elector.acquire()
        await anyio.sleep_forever()

    try:
        first = await p.acquire()
        async with anyio.create_task_group() as tg:
            tg.start_soon(campaign, q)
            await eventually(lambda: _has(fresh_etcd, name, 2), 5, "q's key")
            tg.start_soon(campaign, w)
            await eventually(lambda: _has(fresh_etcd, name, 3), 5, "w's key")
            await asyncio.wait_for(late.taken.wait(), 5)  # W read "P leads"; the reply is on its way
            w_key = next(kv["key"] for kv in await keys(fresh_etcd, name) if kv["value"] == "w")

            await first.release()
            await eventually(lambda: "q" in got, 10, "q leads")
            again = asyncio.get_running_loop().create_task(p.acquire())  # same lease, same key bytes
            await eventually(lambda: _has(fresh_etcd, name, 3), 5, "p's key again")
            await _delete(q, w_key)  # by hand: W puts it again, now behind P's
            await eventually(lambda: _has(fresh_etcd, name, 3), 5, "w's key again")
            order = [kv["value"] for kv in sorted(await keys(fresh_etcd, name), key=lambda kv: kv["create_revision"])]
            assert order == ["q", "p", "w"]

            late.deliver()
            await asyncio.sleep(0.3)
            again.cancel()  # P gives up: its key is deleted
            with contextlib.suppress(asyncio.CancelledError):
                await again
            await eventually(lambda: _has(fresh_etcd, name, 2), 5, "p's key gone")
            await asyncio.sleep(1.0)
            assert got["q"].held
            assert "w" not in got, "w leads beside q"

            late.end()
            await got["q"].release()
            await eventually(lambda: "w" in got, 10, "w leads after q")
            await _lead_on_a_standing_key(fresh_etcd, name, got["w"], "w")
            tg.cancel_scope.cancel()
    finally:
        late.end()
        for elector in (p, q, w):
            await elector.aclose()
    assert await leases(fresh_etcd) == []


def test_only_a_read_taken_while_our_key_stood_proves_a_handover() -> None:
    """Our key (bytes ``w``) created at 8; the predecessor ``p`` deleted at 10."""
    backend = EtcdBackend("127.0.0.1:2379", name="/t")
    read = View(leader=b"/t/p", identity="p", ours=b"/t/w", predecessor=b"/t/p", revision=9, created=8)
    for view, proves in [
        (read, True),
        (replace(read, revision=8), True),
        (replace(read, revision=7), False),  # read before our key was put (the same bytes, put earlier)
        (replace(read, created=4, revision=9), False),  # read for an earlier key with the same bytes
        (replace(read, revision=10), False),  # read at the deletion: proves nothing before it
        (replace(read, leader=b"/t/q"), False),
    ]:
        backend.sight.end()
        backend.sight.read(view)
        assert backend._led_before(b"/t/p", b"/t/w", 8, 10) is proves, view


def test_the_sight_is_replaced_only_by_a_read_that_is_not_older() -> None:
    """The election's view has one owner: a late reply for an earlier view, or an older read, never replaces it."""
    reported: list[str | None] = []
    sight = Sight(reported.append)
    first = View(leader=b"/t/p", identity="p", ours=b"/t/w", predecessor=b"/t/p", revision=9, created=8)
    sight.read(first)
    assert sight.current is first and reported == ["p"]
    sight.read(replace(first, revision=7, leader=b"/t/x", identity="x"))  # older, same incarnation: dropped
    assert sight.current is first
    newer = replace(first, revision=12)
    sight.read(newer)
    assert sight.current is newer

    class Kv:
        key, value = b"/t/q", b"q"

    sight.read_later(first, Kv(), 20)  # taken for a view that is gone: dropped
    sight.read_later(newer, Kv(), 11)  # read before the view: dropped
    assert sight.current is newer
    sight.read_later(newer, Kv(), 13)
    assert sight.current is not None and sight.current.leader == b"/t/q" and sight.current.revision == 13
    again = replace(first, created=15, revision=15)  # our key put again: a new incarnation replaces any view
    sight.read(again)
    assert sight.current is again
    sight.end()
    assert sight.current is None


class _CancelFollowOnce:
    """At a waiter's seam: etcd cancels the watch by which its leader watch follows the leader, once."""

    def __init__(self) -> None:
        self.cancelled = False

    def exchange(self, what: str, send: Any) -> Any:
        # Called as the watch read starts: the leader watch's if _follow is on the stack then.
        following = any(frame.f_code.co_name == "_follow" for frame in _frames())
        cancel = what == "watch message" and following and not self.cancelled
        self.cancelled |= cancel
        return self._reply(send, cancel)

    async def _reply(self, send: Any, cancel: bool) -> Any:
        if cancel:
            return rpc.WatchResponse(canceled=True, cancel_reason="cancelled by the server")
        return await send()


def _frames() -> Any:
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        yield frame
        frame = frame.f_back


async def _hold(elector: EtcdElector) -> None:
    await elector.acquire()
    await asyncio.sleep(60)


async def test_a_waiter_follows_the_leader_again_after_etcd_cancels_its_watch(etcd: EtcdServer) -> None:
    name = unique()
    p, q, w = (EtcdElector(etcd.endpoints, name=name, identity=i, ttl=TTL) for i in "PQW")
    cancel = _CancelFollowOnce()
    w._backend.conn.interceptor = cancel  # type: ignore[attr-defined]
    tasks: list[asyncio.Task[Any]] = []
    try:
        lead = await p.acquire()
        for elector in (q, w):  # in order: Q is next, W behind it follows P
            tasks.append(asyncio.create_task(_hold(elector)))
            await eventually(lambda e=elector: e.last_leader == "P", 5.0, f"{elector} to see P lead")  # type: ignore[misc]
        await eventually(lambda: cancel.cancelled, 5.0, "the leader watch's watch cancelled")
        await asyncio.sleep(0.3)  # the leader watch has handled the cancel
        await lead.release()
        await eventually(lambda: q.leading, 5.0, "Q to lead")
        await eventually(lambda: w.last_leader == "Q", 5.0, "W to see Q lead")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for elector in (p, q, w):
            await elector.aclose()
