"""The election's keys, following etcd's Go ``client/v3/concurrency`` ``Election``.

Keys and revisions are those of ``election.go``, so that these candidates,
``etcdctl elect`` and Go programs share one election on the same prefix:

* a candidate's key is ``{name}/{lease id in hex}``, its value the identity,
  created under the session's lease only if absent;
* the leader is the key with the lowest create revision under ``{name}/``;
* a candidate waits for the deletion of the nearest key created before its
  own (never the whole prefix: no thundering herd), then checks again.

:class:`Election` owns these requests and who leads (``leader()``,
``observe()``); the campaign with sessions is built on it in
:mod:`._backend`. Each step reads what it needs in one request: the
campaign transaction creates our key *and* returns the key created just
before it; after that key's deletion one transaction checks that our key
still stands under our lease *and* looks for an older key left. In a small
election no such read is needed once the predecessor was seen leading: one
watch covers both keys, and its revisions say whether our key stood,
first, when the predecessor went.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
from aetcd import rpc
from aetcd.utils import prefix_range_end

from ...core._backend import Backend, Backoff, Interceptor
from ...core._errors import BackendUnavailable, ElectionError, PermanentBackendError
from ._admission import Lane
from ._connection import Connection
from ._failures import Compacted, Retired, Transient
from ._session import Session
from ._watch import WatchStream

__all__ = ["DELETE", "RANGE_WAIT_MAX", "Election", "KeyLost", "OpenWatch", "Sight", "Turn", "View", "Waited"]

DELETE = rpc.Event.DELETE
#: Up to this many candidates, a waiting candidate watches the keys from its predecessor's to its own (see
#: ``_wait_turn``): events of the candidates whose keys sort in between reach it too, so not in a crowd.
RANGE_WAIT_MAX = 16


def _identity(value: bytes) -> str:
    return value.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class View:
    """What a campaign last read of the election: who led at ``revision``, for one incarnation of our key.

    A value: only :class:`Sight` holds the current one, and replaces it.
    """

    #: The leader's key and identity (None: nobody), our key, and the key we wait for.
    leader: bytes | None
    identity: str | None
    ours: bytes
    predecessor: bytes | None
    revision: int
    #: Our key's create revision: the same key bytes put again (after a delete by hand) are another candidate.
    created: int


class Sight:
    """The election as the current campaign last read it: the one owner of the current :class:`View`.

    Guarantees: the view is replaced only by a read that cannot be older
    than it. The campaign's own reads (:meth:`read`) replace a view of an
    earlier incarnation of our key, or of the same one read at a revision
    not below it; a read of the leader watch (:meth:`read_later`) replaces
    only the view it was taken for, while that view is still current, and
    only if it was read after it. A late reply for an earlier view is
    dropped, so a read from before our key was put again can never stand
    for the key now.
    """

    def __init__(self, report: Callable[[str | None], None]) -> None:
        self._report = report
        self._view: View | None = None
        self._changed = anyio.Event()

    @property
    def current(self) -> View | None:
        """The current view; None outside a campaign."""
        return self._view

    @property
    def changed(self) -> anyio.Event:
        """Set when :attr:`current` is replaced (take it together with :attr:`current`)."""
        return self._changed

    def read(self, view: View) -> None:
        """A campaign's own read: made current unless the current view is of this incarnation and newer."""
        now = self._view
        if now is not None and (now.ours, now.created) == (view.ours, view.created) and view.revision < now.revision:
            return
        self._replace(view)

    def read_later(self, base: View, kv: Any, revision: int) -> None:
        """The leader watch's read for ``base``: current only if ``base`` still is, and the read is after it."""
        if self._view is not base or revision <= base.revision:
            return
        leader = None if kv is None else bytes(kv.key)
        identity = None if kv is None else _identity(kv.value)
        self._replace(replace(base, leader=leader, identity=identity, revision=revision))

    def end(self) -> None:
        """The campaign ended: nothing to watch for it any more."""
        self._view = None
        self._wake()

    def _replace(self, view: View) -> None:
        """Make ``view`` current, wake the leader watch, and report the leader unless it is us (we won)."""
        self._view = view
        self._wake()
        if view.leader != view.ours:
            self._report(view.identity)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


def _changed(event: Any, key: bytes, revision: int, lease: int) -> bool:
    """Whether ``event`` deletes ``key`` or leaves it with another create revision or lease."""
    kv = event.kv
    return bytes(kv.key) == key and (event.type == DELETE or kv.create_revision != revision or kv.lease != lease)


class OpenWatch:
    """A watch kept open beyond one ``async with`` (handed from a campaign to its leadership); close it once."""

    def __init__(self, stack: contextlib.AsyncExitStack, stream: WatchStream) -> None:
        self._stack = stack
        self.stream = stream
        #: The revision up to which the watch has been read (what it proved).
        self.revision = 0

    @classmethod
    async def open(cls, conn: Connection, key: bytes, **options: Any) -> OpenWatch:
        """:meth:`Connection.watch` of ``key`` with ``options``, open until :meth:`close`."""
        stack = contextlib.AsyncExitStack()
        stream = await stack.enter_async_context(conn.watch(key, **options))
        return cls(stack, stream)

    async def close(self) -> None:
        """Cancel the watch; never interrupted."""
        with anyio.CancelScope(shield=True):
            await self._stack.aclose()


class Turn(enum.Enum):
    """What a wait for the predecessor's deletion found (:meth:`Election._wait_turn`)."""

    #: The store had moved past the read before the watch began: read again now (not twice in a row).
    SKIPPED = "skipped"
    #: The predecessor may be gone, or our key changed, or the watch broke: read again.
    READ_AGAIN = "read again"
    #: The predecessor went while our key stood first under our lease: we lead (see :class:`Waited`).
    LEADING = "leading"


@dataclass(frozen=True)
class Waited:
    """A :class:`Turn`, and for :attr:`Turn.LEADING` the watch that proved it, open on our key from its
    :attr:`OpenWatch.revision` (the leadership goes on watching with it)."""

    turn: Turn
    watch: OpenWatch | None = None


class KeyLost(Exception):
    """Our candidate key vanished while our lease lives (deleted by hand): put it again."""


class Election(Backend):
    """One election on etcd: its candidates' keys under ``{name}/``, and who leads.

    Guarantees: every request is one bounded request on ``conn``
    (:meth:`Connection.call`); :meth:`leader` and :meth:`observe` report
    only what etcd says (or, while :meth:`local_leader` names one, that
    local leader when etcd cannot be reached), never a guess.
    """

    def __init__(self, name: str, conn: Connection, *, request_timeout: float) -> None:
        super().__init__(name)
        self.conn = conn
        self.request_timeout = request_timeout
        self.prefix = (name + "/").encode()
        self._prefix_end = prefix_range_end(self.prefix)
        #: How many candidates the last campaign transaction saw (None: unknown).
        self.crowd: int | None = None
        #: The election as the current campaign last read it.
        self.sight = Sight(lambda identity: self._reporter.leader(identity))

    def intercept(self, interceptor: Interceptor | None) -> None:
        self.conn.interceptor = interceptor  # the connection's requests and watches

    def local_leader(self) -> str | None:
        """The identity leading without etcd (see :mod:`._degraded`), or None."""
        return None

    # --- requests ------------------------------------------------------------------

    def _own(self, kvs: Any) -> Any:
        """``kvs``, if every key is one of this election's candidates; else :class:`ElectionError`.

        A candidate's key is one level under the prefix (``{name}/{lease}``,
        as Go writes it). A deeper key belongs to a nested election
        (``{name}/other/{lease}``), whose keys share our prefix and would lead
        this election or be waited for here: a permanent misconfiguration.
        """
        for kv in kvs:
            key = bytes(kv.key)
            if b"/" in key[len(self.prefix) :]:
                other = key[: key.rindex(b"/")].decode(errors="replace")
                raise PermanentBackendError(
                    f"etcd election {self.name!r} contains the keys of election {other!r} (key "
                    f"{key.decode(errors='replace')!r}): a name followed by '/' must not begin another election's "
                    f"name, since candidates of {self.name!r} would wait for those of {other!r}; rename one of them"
                )
        return kvs

    async def get_key(self, key: bytes) -> tuple[Any, int]:
        """(our key's KeyValue or None, header revision)."""
        reply = await self.conn.call(
            "read key",
            lambda ch: ch.kv.Range(rpc.RangeRequest(key=key), metadata=ch.metadata),
            timeout=self.request_timeout,
            lane=Lane.HOLD,
        )
        return (reply.kvs[0] if reply.kvs else None), int(reply.header.revision)

    def _first_request(self) -> rpc.RangeRequest:
        """The key with the lowest create revision under the prefix: the leader's."""
        return rpc.RangeRequest(
            key=self.prefix,
            range_end=self._prefix_end,
            sort_order=rpc.RangeRequest.ASCEND,
            sort_target=rpc.RangeRequest.CREATE,
            limit=1,
        )

    def _saw(self, kvs: Any, ours: bytes, created: int, predecessor: bytes | None, revision: int) -> None:
        """Record the leader a campaign transaction read (:meth:`Sight.read`).

        ``created`` is our key's create revision, ``revision`` the one the
        transaction read at (not below ``created``).
        """
        kv = kvs[0] if kvs else None
        leader = None if kv is None else bytes(kv.key)
        identity = None if kv is None else _identity(kv.value)
        self.sight.read(View(leader, identity, ours, predecessor, revision, created))

    async def watch(self) -> AsyncIterator[str | None]:
        """Leaders for a campaign's watch, at no cost while the leader is the key the campaign waits for.

        The campaign's own transactions read the leader too (reported as they
        happen). Only when the leader is neither our key nor the one we wait
        for (three candidates or more) does this follow the leader itself
        (:meth:`_follow`): one read when it starts for a key of ours, then the
        events of one watch, so that a leader change costs no read per
        waiting candidate, however the candidates arrived.
        """
        backoff = Backoff(first=0.1, maximum=2.0)
        while True:
            view, changed = self.sight.current, self.sight.changed
            if view is None or view.leader is None or view.leader in (view.ours, view.predecessor):
                await changed.wait()
                continue
            settled: list[anyio.Event] = []
            try:
                async for identity in self._follow(view, settled):
                    yield identity
                backoff.reset()
            except (Transient, Compacted) as exc:
                if self.conn.closed:
                    return
                self.log.debug("leader watch interrupted (%s); reading again", exc)
                await anyio.sleep(backoff.next_delay())
                continue  # the leader may have changed meanwhile: read again for the view then current
            if settled:
                await settled[-1].wait()  # followed as far as it goes: the campaign reads what comes next

    async def _follow(self, view: View, settled: list[anyio.Event]) -> AsyncIterator[str | None]:
        """Follow the leader from the candidates created before our key, kept up to date by one prefix watch.

        Only those candidates can lead before us, and only a delete or a put
        can change them (a key created later is never ahead of ours): the
        next leader is the oldest of them still standing, known without a
        read. Each change is recorded in the view (:meth:`Sight.read_later`); a put
        of the leader's value is yielded.

        What is followed belongs to our key as created (``view.created``),
        not to one read of it: when the campaign reads the election again
        (campaigns started together find the store moved on, and read again
        while this follows), following goes on from the view that read
        made, without a read of its own. Returns when the campaign's view is
        of another key (or none), or when following is the campaign's job:
        the leader is the key we wait for, or nobody ahead is left. In the
        latter case ``settled`` receives the event set at the view's next
        change, to wait for before following again.
        """
        request = rpc.RangeRequest(key=self.prefix, range_end=self._prefix_end, max_create_revision=view.created - 1)
        reply = await self.conn.call(
            "read candidates ahead",
            lambda ch: ch.kv.Range(request, metadata=ch.metadata),
            timeout=self.request_timeout,
            lane=Lane.CAMPAIGN,
        )
        ahead = {bytes(kv.key): kv for kv in self._own(reply.kvs) if bytes(kv.key) != view.ours}
        revision = int(reply.header.revision)
        ours = (view.ours, view.created)
        current = view

        def next_leader() -> bool:
            """Record the oldest candidate ahead as the leader; False once following is not ours to do."""
            nonlocal current
            now = self.sight.current
            if now is None or (now.ours, now.created) != ours:
                return False  # the campaign ended, or put our key again: follow anew for the view it reads
            current = now
            first = min(ahead.values(), key=lambda kv: int(kv.create_revision), default=None)
            if first is not None and bytes(first.key) != current.leader:
                self.sight.read_later(current, first, revision)  # dropped if the campaign read after `revision`
                current = self.sight.current or current
            if first is None or current.leader in (None, current.ours, current.predecessor):
                # Nobody ahead (our campaign leads next, and says so), or the leader is the key the campaign waits
                # for: its own reads take it from there.
                settled.append(self.sight.changed)
                return False
            return True

        if not next_leader():
            return
        watch = self.conn.watch(
            self.prefix, range_end=self._prefix_end, start_revision=revision + 1, lane=Lane.CAMPAIGN
        )
        async with watch as stream:
            while True:
                response = await stream.next()
                self._own([event.kv for event in response.events])
                # The last event's revision, not the header's: events up to it have all arrived, later ones may not.
                revision = max([revision, *(int(event.kv.mod_revision) for event in response.events)])
                for event in response.events:
                    key = bytes(event.kv.key)
                    if event.type == DELETE:
                        ahead.pop(key, None)
                    elif key in ahead:
                        ahead[key] = event.kv
                        if key == current.leader:
                            yield _identity(event.kv.value)
                if not next_leader():
                    return

    async def first_candidate(self) -> tuple[Any, int]:
        """(the KeyValue with the lowest create revision under the prefix, or None; header revision)."""
        request = self._first_request()
        reply = await self.conn.call(
            "read leader",
            lambda ch: ch.kv.Range(request, metadata=ch.metadata),
            timeout=self.request_timeout,
            lane=Lane.CAMPAIGN,
        )
        kvs = self._own(reply.kvs)
        return (kvs[0] if kvs else None), int(reply.header.revision)

    async def resign(self, key: bytes, revision: int) -> None:
        """Delete ``key`` if its create revision is still ``revision`` (election.go ``Resign``)."""
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key, create_revision=revision)
            ],
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))],
        )
        await self.conn.call(
            "resign", lambda ch: ch.kv.Txn(request, metadata=ch.metadata), timeout=self.request_timeout
        )

    def _last_created(self, *, before: int | None, limit: int) -> rpc.RangeRequest:
        """The ``limit`` keys under the prefix created last (before revision ``before``), newest first."""
        request = rpc.RangeRequest(
            key=self.prefix,
            range_end=self._prefix_end,
            sort_order=rpc.RangeRequest.DESCEND,
            sort_target=rpc.RangeRequest.CREATE,
            limit=limit,
            keys_only=True,
        )
        if before is not None:
            request.max_create_revision = before - 1
        return request

    async def _put_candidate(self, session: Session, key: bytes, value: bytes) -> tuple[int, bytes | None, int]:
        """Create our key under the lease if absent (election.go ``Campaign``) and find the key created before it.

        Returns our key's create revision, the key created just before it (or
        None) and the revision that was read at. One transaction: the range
        after the put sees our new key first and its predecessor second.
        """
        request = rpc.TxnRequest(
            compare=[rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key, create_revision=0)],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=session.lease_id)),
                rpc.RequestOp(request_range=self._last_created(before=None, limit=2)),
                rpc.RequestOp(request_range=self._first_request()),  # who leads, for followers: no request more
            ],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key))],
        )
        reply = await self.conn.call(
            "campaign",
            lambda ch: ch.kv.Txn(request, metadata=ch.metadata),
            timeout=self.request_timeout,
            lane=Lane.CAMPAIGN,
        )
        if reply.succeeded:
            self.crowd = int(reply.responses[1].response_range.count)
            revision = int(reply.header.revision)
            last = self._own(reply.responses[1].response_range.kvs)
            older = [kv for kv in last if kv.create_revision < revision]
            predecessor = bytes(older[0].key) if older else None
            self._saw(self._own(reply.responses[2].response_range.kvs), key, revision, predecessor, revision)
            return revision, predecessor, revision
        # Our key exists already (a campaign step retried after a timeout, or a key of ours left over).
        self.crowd = None
        kvs = reply.responses[0].response_range.kvs
        if not kvs:
            raise KeyLost()
        revision = int(kvs[0].create_revision)
        if kvs[0].value != value or kvs[0].lease != session.lease_id:  # election.go's Proclaim: our key, our value
            proclaim = rpc.TxnRequest(
                compare=[
                    rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key, create_revision=revision)
                ],
                success=[rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=session.lease_id))],
            )
            done = await self.conn.call(
                "proclaim",
                lambda ch: ch.kv.Txn(proclaim, metadata=ch.metadata),
                timeout=self.request_timeout,
                lane=Lane.CAMPAIGN,
            )
            if not done.succeeded:
                raise KeyLost()
        predecessor, read_at = await self._check(session, key, revision)
        return revision, predecessor, read_at

    async def _check(self, session: Session, key: bytes, revision: int) -> tuple[bytes | None, int]:
        """Whether our key still stands under our lease *and* which key was created just before it, as of one revision.

        Returns (that key or None, the revision read at); raises
        :class:`SessionEnded` if our key went with our lease, ``KeyLost`` if
        it went otherwise. Plain reads, never a read-only transaction: etcd
        3.5.0 to 3.5.4 panics when the client of one goes away while it is
        applied (etcd-io/etcd#14110), and a campaign's request can always be
        cancelled. The leader is read first: when it is our key (the usual
        answer once our predecessor went) that read is the whole check;
        otherwise our key and the one before it are read at its revision.
        """
        first = await self._read("check candidacy", self._first_request())
        read_at = int(first.header.revision)
        leader = self._own(first.kvs)
        if leader and bytes(leader[0].key) == key:
            mine, predecessor = leader[0], None
        else:
            request = self._last_created(before=revision + 1, limit=2)  # ours, then the one before it
            request.revision = read_at
            kvs = self._own((await self._read("check candidacy", request)).kvs)
            mine = kvs[0] if kvs and bytes(kvs[0].key) == key else None
            predecessor = bytes(kvs[1].key) if mine is not None and len(kvs) > 1 else None
        if mine is None or int(mine.create_revision) != revision or int(mine.lease) != session.lease_id:
            await session.keepalive()  # raises SessionEnded if the key went with our lease
            raise KeyLost()
        self._saw(leader, key, revision, predecessor, read_at)
        return predecessor, read_at

    async def _read(self, what: str, request: rpc.RangeRequest) -> Any:
        return await self.conn.call(
            what,
            lambda ch: ch.kv.Range(request, metadata=ch.metadata),
            timeout=self.request_timeout,
            lane=Lane.CAMPAIGN,
        )

    async def _wait_turn(
        self, predecessor: bytes, read_at: int, *, shortcut: bool, ours: tuple[bytes, int, int] | None = None
    ) -> Waited:
        """Return once ``predecessor`` may be gone (key.go ``waitDelete``), saying what the wait found.

        The watch starts at ``read_at + 1``: a watch starting at or below the
        store's current revision is served on etcd's slow path (its events
        come from a background loop, up to 100 ms late). If the store has
        moved past ``read_at`` by the time etcd creates the watch, and
        ``shortcut`` allows, return :attr:`Turn.SKIPPED` at once instead:
        reading again is faster (the caller does not allow it twice in a
        row, so that a busy prefix cannot keep us reading).

        With ``ours``, also tell when the deletion makes us the leader,
        without a read (:attr:`Turn.LEADING`). ``ours`` is (our key, its create revision, our lease): one watch then
        covers both keys (from the lower to the higher), so that etcd
        delivers their events in revision order. If ``predecessor`` led in a
        read before its deletion at revision R (the campaign's, or the
        leader watch's once the keys before it went: :meth:`_led_before`),
        no key older than ours but it existed then, and none can be created
        later; so its deletion at R with our key untouched up to R (no
        delete, no other create revision or lease) means that at R our key
        stood first, under our lease. The watch is then handed over open
        (:attr:`OpenWatch.revision` is R): it goes on watching our key for
        the leadership. Any other outcome is :attr:`Turn.READ_AGAIN`.
        """
        key, range_end = predecessor, None
        if ours is not None:
            key, range_end = min(predecessor, ours[0]), max(predecessor, ours[0]) + b"\0"
        self.log.debug("waiting for %s to go", predecessor.decode(errors="replace"))
        watching = None
        try:
            watching = await OpenWatch.open(
                self.conn, key, range_end=range_end, start_revision=read_at + 1, no_put=ours is None, lane=Lane.CAMPAIGN
            )
            if shortcut and watching.stream.created_revision > read_at:
                return Waited(Turn.SKIPPED)
            while True:
                events = (await watching.stream.next()).events
                if ours is not None and any(_changed(event, *ours) for event in events):
                    return Waited(Turn.READ_AGAIN)
                gone = [int(e.kv.mod_revision) for e in events if e.type == DELETE and bytes(e.kv.key) == predecessor]
                if gone and ours is not None and self._led_before(predecessor, ours[0], ours[1], gone[0]):
                    watching.revision = gone[0]
                    handed, watching = watching, None
                    return Waited(Turn.LEADING, handed)
                if gone:
                    return Waited(Turn.READ_AGAIN)
        except (Retired, Compacted):
            pass  # look again
        except Transient as exc:
            if not exc.rotate:
                raise
            self.log.debug("watch failed (%s); looking again on the next endpoint", exc)
        finally:
            if watching is not None:
                await watching.close()
        return Waited(Turn.READ_AGAIN)

    def _led_before(self, predecessor: bytes, ours: bytes, created: int, revision: int) -> bool:
        """Whether a read of this campaign, before ``revision``, found ``predecessor`` leading beside our key.

        Only a read taken while our key stood, as created at ``created``,
        proves it: a read from before (of an earlier key with the same bytes)
        says nothing about the keys created before this one.
        """
        view = self.sight.current
        return (
            view is not None
            and view.ours == ours
            and view.created == created
            and created <= view.revision < revision
            and view.leader == predecessor
        )

    # --- who leads -------------------------------------------------------------------

    async def leader(self) -> str | None:
        """The value of the key with the lowest create revision under the prefix.

        While we lead locally because etcd is unreachable, that is us.
        """
        try:
            kv, _ = await self.first_candidate()
        except Transient as exc:
            local = self.local_leader()
            if local is not None:
                return local
            raise BackendUnavailable(f"etcd at {self.conn.describe()} is unreachable: {exc}") from None
        return None if kv is None else _identity(kv.value)

    async def observe(self) -> AsyncIterator[str | None]:
        """Yield the leader now and at each change; resynchronise after any interruption.

        As election.go's ``Observe``: read the first candidate, then watch
        its key (a put is a new value, a delete means read again), or while
        nobody leads, watch the prefix for the first put. A broken or
        compacted watch is never skipped over: we read again and yield what
        changed meanwhile. Ends when the elector is closed.
        """
        last: object = object()
        backoff = Backoff(first=0.1, maximum=2.0)
        while True:
            try:
                kv, revision = await self.first_candidate()
            except Transient as exc:
                local = self.local_leader()
                if local is not None and local != last:
                    last = local
                    yield local
                delay = backoff.next_delay()
                self.log.warning("observe: cannot read the leader (%s); retrying in %.2fs", exc, delay)
                await anyio.sleep(delay)
                continue
            except ElectionError:
                if self.conn.closed:
                    return
                raise
            current = None if kv is None else _identity(kv.value)
            if current != last:
                last = current
                yield current
            try:
                if kv is None:
                    async with self.conn.watch(
                        self.prefix,
                        range_end=self._prefix_end,
                        start_revision=revision + 1,
                        no_delete=True,
                        lane=Lane.CAMPAIGN,
                    ) as stream:
                        await stream.next()
                else:
                    async with self.conn.watch(
                        bytes(kv.key), start_revision=revision + 1, lane=Lane.CAMPAIGN
                    ) as stream:
                        while True:
                            response = await stream.next()
                            if any(event.type == DELETE for event in response.events):
                                break
                            value = _identity(response.events[-1].kv.value)
                            if value != last:
                                last = value
                                yield value
                backoff.reset()
            except Transient as exc:
                if self.conn.closed:
                    return
                self.log.info("observe: watch interrupted (%s); resynchronising", exc)
                if not isinstance(exc, Retired):
                    await anyio.sleep(backoff.next_delay())
            except ElectionError:
                if self.conn.closed:
                    return
                raise
