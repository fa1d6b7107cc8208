"""The election, following etcd's Go ``client/v3/concurrency`` ``Election``.

Keys and revisions are those of ``election.go``, so that these candidates,
``etcdctl elect`` and Go programs share one election on the same prefix:

* a candidate's key is ``{name}/{lease id in hex}``, its value the identity,
  created under the session's lease only if absent;
* the leader is the key with the lowest create revision under ``{name}/``;
* a candidate waits for the deletion of the nearest key created before its
  own (never the whole prefix: no thundering herd), then checks again.

Beyond Go's ``Campaign``: the wait ends if our own session expires (etcd
issue 19597), after which we campaign again with a new session; and before
a campaign returns, our key is checked to still exist under our lease.

As Go's ``Session``, one session (lease) serves the successive campaigns of
an elector: a release deletes our key only, and the lease is revoked when
the elector closes, or at once when the session cannot be trusted any more
(a lost leadership, a failed resign or campaign, keep-alives late). Each
step reads what it needs in one request: the campaign transaction creates
our key *and* returns the key created just before it; after that key's
deletion one transaction checks that our key still stands under our lease
*and* looks for an older key left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import anyio
from aetcd import rpc
from aetcd.utils import prefix_range_end

from ..._backend import Backend, Backoff, Confirm, Hold, monotonic
from ..._config import check_options, positive, validate_name
from ..._errors import BackendUnavailable, ElectionError
from .session import (
    Compacted,
    Connection,
    EtcdTLS,
    Retired,
    Session,
    SessionEnded,
    Transient,
    first_of,
    parse_endpoints,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["EtcdBackend", "EtcdOptions"]

#: etcd grants no lease shorter than its minimum TTL (2 s with default timings).
MIN_TTL = 2

_DELETE = rpc.Event.DELETE


def _identity(value: bytes) -> str:
    return value.decode("utf-8", errors="replace")


class _KeyLost(Exception):
    """Our candidate key vanished while our lease lives (deleted by hand): put it again."""


class EtcdHold(Hold):
    """Leadership held as the candidate key with the lowest create revision."""

    def __init__(
        self, backend: EtcdBackend, session: Session, key: bytes, revision: int, acquired_at: float, watch_from: int
    ) -> None:
        self._backend = backend
        self._session = session
        self.key = key
        self.revision = revision
        self.token = revision
        self.acquired_at = acquired_at
        self._watch_from = watch_from
        self._released = False
        self._lost = False

    async def monitor(self, confirm: Confirm) -> str:
        session = self._session
        session.on_confirm = confirm
        if session.confirmed_at > self.acquired_at:
            confirm(session.confirmed_at)
        try:
            _, reason = await first_of(self._session_ended, self._key_deleted)
            self._lost = True
            return str(reason)
        finally:
            session.on_confirm = None

    async def _session_ended(self) -> str:
        return f"session ended: {await self._session.wait_ended()}"

    async def _key_deleted(self) -> str:
        """Return once our key is gone; resynchronise by reading it whenever the watch breaks."""
        b = self._backend
        start = self._watch_from
        backoff = Backoff(first=0.05, maximum=1.0)
        while True:
            try:
                async with b.conn.watch(self.key, start_revision=start, no_put=True) as stream:
                    backoff.reset()
                    while True:
                        response = await stream.next()
                        if any(event.type == _DELETE for event in response.events):
                            return await self._why_deleted()
                        start = max(start, int(response.header.revision) + 1)
            except Transient as exc:
                b.log.debug("watch on our key interrupted (%s); reading it again", exc)
                if not isinstance(exc, Retired):
                    await anyio.sleep(backoff.next_delay())
            try:
                kv, revision = await b.get_key(self.key)
            except Transient as exc:
                b.log.debug("cannot read our key (%s); the session decides", exc)
                continue
            if kv is None or kv.create_revision != self.revision or kv.lease != self._session.lease_id:
                return await self._why_deleted()
            start = revision + 1

    async def _why_deleted(self) -> str:
        b = self._backend
        try:
            reply = await b.conn.call(
                "lease time-to-live",
                lambda ch: ch.lease.LeaseTimeToLive(
                    rpc.LeaseTimeToLiveRequest(ID=self._session.lease_id), metadata=ch.metadata
                ),
                timeout=b.session_keepalive_timeout,
                attempts=1,
            )
            if reply.TTL < 0:
                return "leader key deleted: our lease was revoked or expired"
        except (Transient, ElectionError):
            pass
        return "leader key deleted (resigned elsewhere or removed by hand)"

    async def release(self) -> None:
        """Resign as election.go does (delete our key if it is still ours); the next candidate leads at once.

        The session is kept for the elector's next campaign only if the resign
        succeeded and the session is sound (see :meth:`EtcdBackend.reusable`);
        otherwise its lease is revoked too, which removes the key if the resign
        could not. Bounded by ``release_timeout``; never interrupted.
        """
        if self._released:
            return
        self._released = True
        b = self._backend
        session = self._session
        keep = False
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(b.release_timeout):
                    try:
                        await b.resign(self.key, self.revision)
                        keep = not self._lost and b.reusable(session)
                    except (Transient, ElectionError) as exc:
                        b.log.debug("resign failed (%s); revoking the lease removes the key", exc)
                    if not keep:
                        await session.close()
            finally:
                if not keep:
                    await b.drop(session)


#: Why a degraded leadership ends.
ETCD_ANSWERED = "etcd answered: the local leadership taken without mutual exclusion ends; campaign on etcd"


class DegradedHold(Hold):
    """Local leadership while etcd has never answered this elector (``degrade_to_local=True``).

    Guarantees: it lasts only until etcd answers. It asks etcd every
    ``keepalive_interval`` (and notices any other request of the elector
    that etcd answers, :meth:`EtcdBackend.leader` included) and is lost as
    soon as one is answered, with a reason starting "etcd answered", so that
    the next campaign is on etcd.
    """

    def __init__(self, backend: EtcdBackend, identity: str) -> None:
        self._backend = backend
        self._identity = identity
        self.acquired_at = monotonic()

    async def monitor(self, confirm: Confirm) -> str:
        _, reason = await first_of(lambda: self._confirm_on_time(confirm), self._until_etcd_answers)
        return str(reason)

    async def _confirm_on_time(self, confirm: Confirm) -> None:
        # Nothing to renew: confirm on time so that the keeper's renew deadline does not fence us.
        while True:
            confirm(monotonic())
            await anyio.sleep(self._backend.keepalive_interval)

    async def _until_etcd_answers(self) -> str:
        b = self._backend
        while not b.conn.ever_answered:
            try:
                await b.first_candidate()
            except Transient as exc:
                b.log.debug("etcd still unreachable (%s); leading locally", exc)
            except ElectionError as exc:
                return f"{ETCD_ANSWERED} ({exc})"
            if not b.conn.ever_answered:
                await anyio.sleep(b.keepalive_interval)
        return ETCD_ANSWERED

    async def release(self) -> None:
        if self._backend.degraded is self:
            self._backend.degraded = None

    @property
    def identity(self) -> str:
        return self._identity


class _Named(TypedDict):
    #: The election's name: candidates' keys live under ``{name}/`` (at most 1024 characters).
    name: str


class EtcdOptions(_Named, total=False):
    """The options of an etcd election; :class:`EtcdBackend` validates them."""

    #: The session lease in whole seconds, at least 2 (default 5); keep-alives go out every ``ttl / 3``.
    ttl: int
    #: etcd credentials: both or neither.
    username: str | None
    password: str | None
    #: Lead locally, WITHOUT mutual exclusion, while etcd has never answered (default False).
    degrade_to_local: bool
    #: Seconds to authenticate, and the bound on each request to one endpoint (default 5).
    connect_timeout: float
    #: Seconds a leader may go without an acknowledged keep-alive (default ``2 * ttl / 3``).
    renew_deadline: float | None
    #: PEM files: the CA that signs etcd's certificate (default: the system CAs), the client certificate and key.
    ca_file: str | None
    cert_file: str | None
    key_file: str | None


class EtcdBackend(Backend):
    """Elections on an etcd cluster, built from its endpoints and :class:`EtcdOptions`.

    The constructor validates every option (ValueError naming it, never the
    password) and reads the TLS files; it connects to nothing.
    """

    kind = "etcd"

    def __init__(self, endpoints: str | Sequence[str], **options: Unpack[EtcdOptions]) -> None:
        check_options("EtcdElector", options, EtcdOptions)
        ca_file, cert_file, key_file = options.get("ca_file"), options.get("cert_file"), options.get("key_file")
        ttl: int = options.get("ttl", 5)
        renew_deadline = options.get("renew_deadline")
        username, password = options.get("username"), options.get("password")
        degrade_to_local = options.get("degrade_to_local", False)
        parsed = parse_endpoints(endpoints)
        tls_files = any(f is not None for f in (ca_file, cert_file, key_file))
        plain = [e for e in parsed if e.scheme == "http"]
        if plain and tls_files:
            raise ValueError(
                f"endpoint http://{plain[0]} is plain HTTP but ca_file/cert_file/key_file ask for TLS: use https://"
            )
        https = parsed[0].scheme == "https"  # every endpoint's, as parse_endpoints checked
        tls = EtcdTLS.load(ca_file, cert_file, key_file) if tls_files or https else None
        name = validate_name(options["name"], max_length=1024)
        if isinstance(ttl, bool) or not float(positive("ttl", ttl)).is_integer():
            raise ValueError(f"ttl must be a whole number of seconds (etcd leases have whole-second TTLs), not {ttl!r}")
        ttl = int(ttl)
        if ttl < MIN_TTL:
            raise ValueError(f"ttl must be at least {MIN_TTL} seconds: etcd grants no shorter lease")
        interval = ttl / 3
        deadline = positive("renew_deadline", renew_deadline) if renew_deadline is not None else ttl * 2 / 3
        if deadline >= ttl:
            raise ValueError(
                f"renew_deadline ({deadline:g}s) must be shorter than ttl ({ttl}s): a leader must stop "
                "before its lease can expire and another candidate take over"
            )
        if deadline <= interval:
            raise ValueError(
                f"renew_deadline ({deadline:g}s) must be longer than the keep-alive interval ttl/3 ({interval:.3g}s): "
                "otherwise a healthy leader would fence itself between two keep-alives"
            )
        connect_timeout = positive("connect_timeout", options.get("connect_timeout", 5.0))
        if (username is None) != (password is None):
            raise ValueError("username and password go together: pass both or neither")
        if username is not None and (not isinstance(username, str) or not username):
            raise ValueError("username must be a non-empty string")
        if password is not None and not isinstance(password, str):
            raise ValueError("password must be a string")
        if not isinstance(degrade_to_local, bool):
            raise ValueError(f"degrade_to_local must be True or False, not {degrade_to_local!r}")
        super().__init__(name)
        self.prefix = (name + "/").encode()
        self._prefix_end = prefix_range_end(self.prefix)
        self.ttl = ttl
        self.keepalive_interval = ttl / 3
        self._renew_deadline = deadline
        # Half the slack between two keep-alives and the deadline: a slow one is retried in time.
        self.session_keepalive_timeout = max(0.1, min(self.keepalive_interval, deadline - self.keepalive_interval) / 2)
        self.connect_timeout = connect_timeout
        self.request_timeout = connect_timeout
        # Resign and revoke end before the elector gives up on a release (5 s).
        self.release_timeout = min(connect_timeout, 4.0)
        self.degrade_to_local = degrade_to_local
        self.conn = Connection(
            parsed,
            username=username,
            password=password,
            connect_timeout=connect_timeout,
            log=lambda: self.log,
            tls=tls,
        )
        #: Every session not yet stopped; ``session`` is the one the next campaign uses, if still alive.
        self.sessions: set[Session] = set()
        self.session: Session | None = None
        self.degraded: DegradedHold | None = None

    @property
    def renew_deadline(self) -> float:
        return self._renew_deadline

    def describe_timing(self) -> str:
        degrade = (
            "leads locally WITHOUT mutual exclusion while etcd has never answered (degrade_to_local=True)"
            if self.degrade_to_local
            else "waits for etcd if it cannot be reached"
        )
        return (
            f"ttl={self.ttl}s keep-alive every {self.keepalive_interval:.3g}s "
            f"(timeout {self.session_keepalive_timeout:.3g}s) renew_deadline={self._renew_deadline:.3g}s "
            f"connect_timeout={self.connect_timeout:g}s endpoints={self.conn.describe()}: "
            f"a resigning leader is replaced at once, a crashed or cut-off one after about {self.ttl}s "
            f"(its lease expiring); a leader that cannot renew fences itself after {self._renew_deadline:.3g}s, "
            f"{self.ttl - self._renew_deadline:.3g}s before its lease can expire; {degrade}"
        )

    # --- requests ------------------------------------------------------------------

    async def get_key(self, key: bytes) -> tuple[Any, int]:
        """(our key's KeyValue or None, header revision)."""
        reply = await self.conn.call(
            "read key",
            lambda ch: ch.kv.Range(rpc.RangeRequest(key=key), metadata=ch.metadata),
            timeout=self.request_timeout,
        )
        return (reply.kvs[0] if reply.kvs else None), int(reply.header.revision)

    async def first_candidate(self) -> tuple[Any, int]:
        """(the KeyValue with the lowest create revision under the prefix, or None; header revision)."""
        request = rpc.RangeRequest(
            key=self.prefix,
            range_end=self._prefix_end,
            sort_order=rpc.RangeRequest.ASCEND,
            sort_target=rpc.RangeRequest.CREATE,
            limit=1,
        )
        reply = await self.conn.call(
            "read leader",
            lambda ch: ch.kv.Range(request, metadata=ch.metadata),
            timeout=self.request_timeout,
        )
        return (reply.kvs[0] if reply.kvs else None), int(reply.header.revision)

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
            ],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key))],
        )
        reply = await self.conn.call(
            "campaign", lambda ch: ch.kv.Txn(request, metadata=ch.metadata), timeout=self.request_timeout
        )
        if reply.succeeded:
            revision = int(reply.header.revision)
            older = [kv for kv in reply.responses[1].response_range.kvs if kv.create_revision < revision]
            return revision, (bytes(older[0].key) if older else None), revision
        # Our key exists already (a campaign step retried after a timeout, or a key of ours left over).
        kvs = reply.responses[0].response_range.kvs
        if not kvs:
            raise _KeyLost()
        revision = int(kvs[0].create_revision)
        if kvs[0].value != value or kvs[0].lease != session.lease_id:  # election.go's Proclaim: our key, our value
            proclaim = rpc.TxnRequest(
                compare=[
                    rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key, create_revision=revision)
                ],
                success=[rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=session.lease_id))],
            )
            done = await self.conn.call(
                "proclaim", lambda ch: ch.kv.Txn(proclaim, metadata=ch.metadata), timeout=self.request_timeout
            )
            if not done.succeeded:
                raise _KeyLost()
        predecessor, read_at = await self._check(session, key, revision)
        return revision, predecessor, read_at

    async def _check(self, session: Session, key: bytes, revision: int) -> tuple[bytes | None, int]:
        """Whether our key still stands under our lease *and* which key was created just before it, in one read.

        Returns (that key or None, the revision read at); raises
        :class:`SessionEnded` if our key went with our lease, ``_KeyLost`` if
        it went otherwise.
        """
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key, create_revision=revision),
                rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.LEASE, key=key, lease=session.lease_id),
            ],
            success=[rpc.RequestOp(request_range=self._last_created(before=revision, limit=1))],
        )
        reply = await self.conn.call(
            "check candidacy", lambda ch: ch.kv.Txn(request, metadata=ch.metadata), timeout=self.request_timeout
        )
        if not reply.succeeded:
            await session.keepalive()  # raises SessionEnded if the key went with our lease
            raise _KeyLost()
        kvs = reply.responses[0].response_range.kvs
        return (bytes(kvs[0].key) if kvs else None), int(reply.header.revision)

    async def _wait_deleted(self, predecessor: bytes, read_at: int, *, shortcut: bool) -> bool:
        """Return once ``predecessor`` may be gone (key.go ``waitDelete``); the caller reads again.

        The watch starts at ``read_at + 1``: a watch starting at or below the
        store's current revision is served on etcd's slow path (its events
        come from a background loop, up to 100 ms late). If the store has
        moved past ``read_at`` by the time etcd creates the watch, and
        ``shortcut`` allows, return at once instead: reading again is faster.
        Returns whether the next wait may take that shortcut again (not twice
        in a row, so that a busy prefix cannot keep us reading).
        """
        self.log.debug("waiting for %s to go", predecessor.decode(errors="replace"))
        try:
            async with self.conn.watch(predecessor, start_revision=read_at + 1, no_put=True) as stream:
                if shortcut and stream.created_revision > read_at:
                    return False
                while not any(event.type == _DELETE for event in (await stream.next()).events):
                    pass
        except (Retired, Compacted):
            pass  # look again
        except Transient as exc:
            if not exc.rotate:
                raise
            self.log.debug("watch failed (%s); looking again on the next endpoint", exc)
        return True

    # --- campaign ------------------------------------------------------------------

    def reusable(self, session: Session) -> bool:
        """True if ``session`` may serve the next campaign: current, alive, and renewed within ``renew_deadline``."""
        return (
            session is self.session
            and not session.done.is_set()
            and not self.conn.closed
            and monotonic() - session.confirmed_at < self._renew_deadline
        )

    async def drop(self, session: Session) -> None:
        """Stop ``session``'s keep-alives and forget it (its lease is revoked or left to expire by the caller)."""
        await session.stop()
        self.sessions.discard(session)
        if self.session is session:
            self.session = None

    async def campaign(self, identity: str) -> Hold:
        value = identity.encode()
        backoff = Backoff(first=0.1, maximum=2.0)
        while True:
            session = self.session
            if session is not None and session.done.is_set():
                # Ended between two campaigns (revoked, expired, keep-alives failing): revoke what may be left.
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.release_timeout):
                    await session.close()
                await self.drop(session)
                session = None
            if session is None:
                try:
                    session = await Session.grant(
                        self.conn,
                        self.ttl,
                        interval=self.keepalive_interval,
                        keepalive_timeout=self.session_keepalive_timeout,
                        request_timeout=self.request_timeout,
                    )
                except Transient as exc:
                    # Only an etcd that never answered this elector: after any contact, another
                    # candidate may lead on etcd, and leading locally would be a second leader.
                    if self.degrade_to_local and not self.conn.ever_answered:
                        return self._degrade(identity, exc)
                    delay = backoff.next_delay()
                    self.report_error(f"cannot start an etcd session ({exc})", delay)
                    await anyio.sleep(delay)
                    continue
                self.session = session
                self.sessions.add(session)
            try:
                return await self._campaign_in(session, value, backoff)
            except SessionEnded as exc:
                self.log.info("session ended while campaigning (%s); campaigning again with a new session", exc)

    async def _campaign_in(self, session: Session, value: bytes, backoff: Backoff) -> Hold:
        """Campaign with ``session`` until we lead; raise SessionEnded if it ends first.

        Anything but success (cancellation included) deletes our key and ends
        the session (revokes its lease). Never degrades: a session means etcd
        answered.
        """
        key = self.prefix + f"{session.lease_id:x}".encode()
        won = False
        try:
            while True:
                try:
                    which, hold = await first_of(session.wait_ended, lambda: self._try(session, key, value))
                except _KeyLost:
                    self.log.warning("our candidate key was deleted while our lease lives; campaigning again")
                    continue
                except Transient as exc:
                    if exc.lease_gone:
                        session.expire("etcd reports the lease gone")
                        raise SessionEnded(str(exc)) from None
                    delay = backoff.next_delay()
                    self.report_error(f"campaign interrupted ({exc})", delay)
                    with anyio.move_on_after(delay):
                        await session.wait_ended()
                    continue
                if which == 0:
                    raise SessionEnded(str(hold))
                backoff.reset()
                won = True
                assert isinstance(hold, EtcdHold)
                return hold
        finally:
            if not won:
                await self._withdraw(session, key)

    async def _try(self, session: Session, key: bytes, value: bytes) -> EtcdHold:
        revision, predecessor, read_at = await self._put_candidate(session, key, value)
        self.log.debug("candidate key %s created at revision %d", key.decode(errors="replace"), revision)
        shortcut = True
        while predecessor is not None:
            shortcut = await self._wait_deleted(predecessor, read_at, shortcut=shortcut)
            # One read: our key still stands under our lease (it would be gone with the lease), any older key left?
            predecessor, read_at = await self._check(session, key, revision)
        # The lease lives at least ttl past its last acknowledged keep-alive: leadership is measured from there.
        return EtcdHold(self, session, key, revision, acquired_at=session.confirmed_at, watch_from=read_at + 1)

    async def _withdraw(self, session: Session, key: bytes) -> None:
        """Delete our candidate key and revoke the lease at once; bounded, never interrupted."""
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(self.release_timeout):
                    if not session.done.is_set():
                        try:
                            await self.conn.call(
                                "withdraw",
                                lambda ch: ch.kv.DeleteRange(rpc.DeleteRangeRequest(key=key), metadata=ch.metadata),
                                timeout=self.request_timeout,
                            )
                        except (Transient, ElectionError) as exc:
                            self.log.debug("deleting our candidate key failed (%s); the lease's end removes it", exc)
                    await session.close()
            finally:
                await self.drop(session)

    def _degrade(self, identity: str, exc: Transient) -> Hold:
        self.log.warning(
            "etcd at %s has never answered this elector (%s); degrade_to_local=True, so leading locally WITHOUT "
            "mutual exclusion: every instance that cannot reach etcd may become leader at the same time. This "
            "leadership is lost as soon as etcd answers. Leave degrade_to_local off to wait for etcd instead.",
            self.conn.describe(),
            exc,
        )
        hold = DegradedHold(self, identity)
        self.degraded = hold
        return hold

    # --- who leads -------------------------------------------------------------------

    async def leader(self) -> str | None:
        """The value of the key with the lowest create revision under the prefix.

        While we lead locally because etcd is unreachable, that is us.
        """
        try:
            kv, _ = await self.first_candidate()
        except Transient as exc:
            if self.degraded is not None:
                return self.degraded.identity
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
                if self.degraded is not None and self.degraded.identity != last:
                    last = self.degraded.identity
                    yield self.degraded.identity
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
                        self.prefix, range_end=self._prefix_end, start_revision=revision + 1, no_delete=True
                    ) as stream:
                        await stream.next()
                else:
                    async with self.conn.watch(bytes(kv.key), start_revision=revision + 1) as stream:
                        while True:
                            response = await stream.next()
                            if any(event.type == _DELETE for event in response.events):
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

    async def aclose(self) -> None:
        """Revoke every lease (the kept session's included), then close the connection."""
        for session in list(self.sessions):
            with anyio.move_on_after(self.release_timeout):
                await session.close()
            await self.drop(session)
        self.sessions.clear()
        self.session = None
        await self.conn.aclose()
