"""Elections on one Redis (or Valkey) server: a lock key with an expiry, renewed by its owner, a token beside it.

Guarantees:

* a leadership is granted by one atomic script (:data:`~._scripts.ACQUIRE`)
  that sets the lock key with ``NX PX`` and takes the next token with
  ``INCR`` only when it is free; it is dated from the send time of that
  script, and every renew from the send time of its own script: the server
  set the expiry later, so the key outlives the renew deadline;
* a renew *sets* the expiry (``PEXPIRE``) and only on the key holding our
  owner prefix: a key deleted, expired or changed by anyone else is a loss,
  seen within ``check_interval`` (plus ``check_timeout``);
* a release deletes the key only if it is ours and publishes on the
  election's channel, which every waiting candidate is subscribed to (one
  subscription per elector, kept across campaigns): the next one tries at
  once (a key deleted by anyone else is published by the leader's next
  renew, or its release); after a crash the key expires within ``lease``,
  and a waiter, which
  sleeps until the key can have expired and then reads its expiry
  (``PTTL``), tries once it has; a releaser that campaigns again lets a
  waiter go first (it waits for a grant to be published, at most
  ``min(2 * poll_interval, 0.25 s)``);
* tokens never go back: every campaign try reads the server's persistence
  (``INFO``: the append-only file; ``appendfsync`` by ``CONFIG GET`` or as
  the URL states it; ``WAITAOF`` on 7.2+) in the round trip of its acquire
  script, on a new connection also before it, and a grant on a server that
  could lose the last ``INCR`` in a crash is withdrawn and refused unless
  ``volatile_tokens=True`` (logged at WARNING);
* the same reads find the settings that could let the key go before its
  expiry or keep renews from coming in time (an eviction
  ``maxmemory-policy``, a short ``timeout``: see :mod:`._bounds`); a server
  that has one is refused, naming it;
* errors no retry can fix (credentials, ACL, a refused certificate, a wrong
  database number, a key of the wrong type, a script error) raise
  :class:`~aioelect.PermanentBackendError` at once; a server that is
  loading, read-only (a replica, during a failover), without its master or
  out of memory, and a connection refused, reset or timed out, are retried;
* with ``min_replicas=N`` a grant stands only once ``WAIT`` says every
  replica the master knows of (``ROLE``, and ``INFO replication`` for one
  still in its first sync), and at least N, has it; otherwise
  the key is deleted again and the campaign retries; every renew counts
  only on the same condition (see :class:`RedisHold`), so a master cut off
  from Sentinel or the cluster bus stops confirming its leader once a
  replica is promoted;
* every campaign try and every renew read ``ROLE``, and the acquire script
  reads the role before it writes: a server that is not a master never
  grants nor confirms; through Sentinel a grant stands only
  once a majority of the configured sentinels (with one configured, that
  one), asked after its ``WAIT``, answer and name the master, none holding
  it down, and a waiting candidate moves to the master the sentinels name;
* a campaign that does not return a leadership (cancellation included)
  leaves no key and no connection behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from ...core._backend import Backend, Backoff, Confirm, Hold, Interceptor, StateStore, monotonic
from ...core._errors import BackendMisconfigured, BackendUnavailable, ElectionError, PermanentBackendError
from ._bounds import CONFIG_READ, config_problem, least_timeout
from ._options import RedisOptions, RedisSettings
from ._replies import bounded
from ._scripts import ACQUIRE, RELEASE, RENEW
from ._state import RedisStateStore

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._cluster import SlotOwner

__all__ = ["RedisBackend", "RedisHold", "identity_of"]

_SHA = {script: hashlib.sha1(script.encode()).hexdigest() for script in (ACQUIRE, RELEASE, RENEW)}
#: What each script's exchange is called for an interceptor.
_WHAT = {ACQUIRE: "acquire", RELEASE: "release", RENEW: "renew"}
#: Error replies a retry can outlive: a server loading its data, without its master or replicas, busy with a
#: script, read-only (a replica, or a master being demoted in a failover), unable to persist or out of memory.
_TRANSIENT_REPLIES = (
    "LOADING",
    "MASTERDOWN",
    "NOREPLICAS",
    "BUSY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "READONLY",
    "MOVED",
    "ASK",
    "MISCONF",
    "OOM",
)
_TRANSIENT_CLASSES = (
    rexc.AskError,  # MOVED too: the slot moved (a failover, a resharding); the retry's connection asks anew
    rexc.ReadOnlyError,
    rexc.BusyLoadingError,
    rexc.TryAgainError,
    rexc.MasterDownError,
    rexc.OutOfMemoryError,
    rexc.ClusterDownError,
)


def identity_of(value: str | None) -> str | None:
    """The identity in a lock key's value ``<nonce>:<token>:<identity>``; a value of another shape as it is."""
    if value is None:
        return None
    parts = value.split(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[2]
    return value


def _tls_verify_error(exc: BaseException) -> ssl.SSLError | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return current
        current = current.__cause__ or current.__context__
    return None


def _command(client: Redis, *args: str | int) -> Awaitable[Any]:
    """One command by name (redis-py does not type ``execute_command``)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call, unused-ignore]


#: Read after each renew: whether the server is a master, and every replica it knows of.
_ROLE_AND_INFO: tuple[tuple[str, ...], ...] = (("ROLE",), ("INFO", "replication"))

#: The most messages a campaign drops from its kept subscription before its first try (those published while it
#: led: its own grant and release).
_DRAINED = 16

#: Upper bound on how long a new campaign lets waiters go first after this elector's own release.
_MAX_HANDOVER = 0.25

#: The sentinels have not answered (yet): no opinion on the master.
_UNKNOWN = object()


def _cancel_if_swallowed() -> None:
    """Raise CancelledError if this task was cancelled during a request whose reply came back anyway.

    redis-py can complete a request although the task awaiting it was
    cancelled meanwhile, losing the cancellation: a campaign would then
    return leadership to a task that was cancelled. ``Task.cancelling()``
    (Python 3.11+) still counts the request. Only for the main path of a
    campaign: inside a shielded cleanup a cancellation is pending on purpose.
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError


class _NoMajority:
    """The sentinels' last answer in a hold: fewer than a majority of them answered (``why``)."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


class _NotConfirmed(Exception):
    """A grant that the server could not make durable or replicate in time (transient: the key is deleted again)."""


class _NotMaster(Exception):
    """The server is not the master the election must use (a replica, or one Sentinel no longer names): transient,
    the retry's new connection asks again."""


def _replica_set(role: Any) -> frozenset[str] | None:
    """The replicas (``ip:port``) a master's ``ROLE`` reply lists, or None when the server is not a master."""
    if not isinstance(role, (list, tuple)) or not role or role[0] != "master":
        return None
    listed = role[2] if len(role) > 2 and isinstance(role[2], (list, tuple)) else ()
    return frozenset(f"{r[0]}:{r[1]}" for r in listed if isinstance(r, (list, tuple)) and len(r) >= 2)


def _known_replicas(info: Any) -> frozenset[str]:
    """Every replica (``ip:port``) a master's ``INFO replication`` lists, whatever its state: one still in its
    first sync (``wait_bgsave``, ``send_bulk``) too, which ``ROLE`` leaves out but Sentinel can promote. ``info``
    is the reply raw (a pipelined read) or parsed by redis-py."""
    if isinstance(info, (bytes, str)):
        text = info.decode() if isinstance(info, bytes) else info
        pairs = [line.partition(":")[::2] for line in text.splitlines()]
        fields: dict[str, Any] = {key: value for key, value in pairs}
    elif isinstance(info, dict):
        fields = info
    else:
        return frozenset()
    known: set[str] = set()
    for key, value in fields.items():
        if not (key.startswith("slave") and key[5:].isdigit()):
            continue
        if isinstance(value, str):
            value = dict(item.partition("=")[::2] for item in value.split(","))
        if isinstance(value, dict) and "ip" in value and "port" in value:
            known.add(f"{value['ip']}:{value['port']}")
    return frozenset(known)


def _info_fields(info: Any) -> dict[str, str]:
    """The ``field:value`` lines of an ``INFO`` reply read raw (a pipelined read), as text."""
    text = info.decode() if isinstance(info, bytes) else str(info)
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and not key.startswith("#"):
            fields[key] = value.strip()
    return fields


def _all_replicas(role: Any, info: Any) -> frozenset[str] | None:
    """The replicas ``ROLE`` lists and those ``INFO replication`` lists (in any state), or None when the server is
    not a master."""
    listed = _replica_set(role)
    return None if listed is None else listed | _known_replicas(info)


class Renewal:
    """What one renew exchange (the script, ``WAIT``, ``ROLE`` in one round trip) found.

    ``mine``: the key still holds our value; ``problem``: why the renew is not a confirmation (None: it is);
    ``replicas``: the replicas the master lists now (None: it is not a master); ``moved``: the connection must
    be opened again (the server is not, or no longer, the master to use).
    """

    __slots__ = ("mine", "moved", "problem", "replicas")

    def __init__(
        self, mine: bool, replicas: frozenset[str] | None, problem: str | None = None, moved: bool = False
    ) -> None:
        self.mine = mine
        self.replicas = replicas
        self.problem = problem
        self.moved = moved


class RedisHold(Hold):
    """The lock key held under our owner prefix: renewed every ``check_interval``, released by an owner check.

    With ``min_replicas`` a renew is a confirmation only when ``WAIT`` says that every replica the master knows of
    (and at least ``min_replicas``) has it, and no replica that had the previous confirmed one has left the
    master (it may have been promoted): each confirmed renew is then on every replica a failover can promote,
    whose copy of the key outlives the renew deadline. Every renew also reads ``ROLE``: a server that is no
    longer a master never confirms, and ``INFO replication`` beside it: a replica still in its first sync (which
    ``ROLE`` leaves out and cannot acknowledge) keeps every renew from counting until it is in sync. Through
    Sentinel the sentinels are asked beside the renews, once per ``check_interval``: a renew counts only while a
    majority of the configured sentinels answer and name this master (none holding it down).
    """

    def __init__(
        self, backend: RedisBackend, owner: str, token: int, acquired_at: float, replicas: frozenset[str] = frozenset()
    ) -> None:
        self._backend = backend
        self.owner = owner
        self.token = token
        self.acquired_at = acquired_at
        #: The replicas that had the last confirmed write: each must confirm the next renew.
        self.replicas = replicas
        #: How many replicas the next ``WAIT`` waits for (every one the master listed last).
        self.expect = len(replicas)
        #: What the sentinels said last: the master's address, None (held down, or none named), or unknown.
        self.named: object = _UNKNOWN

    async def monitor(self, confirm: Confirm) -> str:
        b = self._backend
        async with anyio.create_task_group() as tg:
            if b.settings.sentinels:
                tg.start_soon(self._ask_sentinels)
            try:
                reason = await self._renew(confirm)
            finally:
                tg.cancel_scope.cancel()
        return reason

    async def _ask_sentinels(self) -> None:
        """Every ``check_interval``, which master the sentinels name (beside the renews: never in their way)."""
        b = self._backend
        while True:
            try:
                with anyio.fail_after(b.timing.check_timeout):
                    self.named = await b.named_master(b.lock_client())
            except Exception as exc:
                # No majority answers: the renews stop counting until one does (the keeper fences at the deadline).
                self.named = _NoMajority(b.describe(exc))
                b.log.debug("asking the sentinels failed (%s)", b.describe(exc))
            await anyio.sleep(b.timing.check_interval)

    def _sentinel_problem(self) -> str | None:
        named = self.named
        if named is _UNKNOWN:
            return None
        if isinstance(named, _NoMajority):
            return f"no majority of the sentinels confirmed the master ({named.why})"
        if named is None:
            return "the sentinels hold the master down (a failover is under way), or no majority of them names it"
        here = self._backend.lock_address()
        if isinstance(named, tuple) and here is not None and here != named:
            return f"the sentinels name {named[0]}:{named[1]} as the master, not {here[0]}:{here[1]}"
        return None

    async def _renew(self, confirm: Confirm) -> str:
        b = self._backend
        t = b.timing
        pause = t.check_interval
        while True:
            await anyio.sleep(pause)
            sent = monotonic()
            try:
                with anyio.fail_after(t.check_timeout):
                    found = await b.renew(self.owner, self.replicas, self.expect)
            except Exception as exc:
                if b.permanent(exc):
                    return f"renew refused by Redis: {b.describe(exc)}"
                # The keeper fences at the renew deadline; until then a retry may still confirm, on a new
                # connection (through Sentinel: to the master it names now).
                await b.drop_lock_connection()
                pause = min(t.check_interval, 0.25)
                b.log.warning("renew failed (%s); retrying in %.2fs", b.describe(exc), pause)
                b.reporter_error(f"renew failed ({b.describe(exc)})")
                continue
            if not found.mine:
                return "the lock key no longer holds our value (deleted, expired or changed on the server)"
            problem = found.problem
            moved = found.moved
            if problem is None:
                problem = self._sentinel_problem()
                moved = problem is not None
            if found.replicas is not None:
                self.expect = max(self.expect, len(found.replicas))
            if problem is not None:
                # Not a confirmation: the keeper fences at the renew deadline unless a later renew confirms.
                if moved:
                    await b.drop_lock_connection()
                pause = min(t.check_interval, 0.25)
                b.log.warning("renew not confirmed (%s); retrying in %.2fs", problem, pause)
                b.reporter_error(f"renew not confirmed ({problem})")
                continue
            if found.replicas is not None:
                self.replicas = found.replicas
                self.expect = len(found.replicas)
            pause = t.check_interval
            confirm(sent)

    async def release(self) -> None:
        b = self._backend
        with anyio.move_on_after(b.timing.check_timeout, shield=True):
            try:
                freed = await b.run_script(b.lock_client(), RELEASE, self.owner, b.settings.channel)
                if not freed:
                    b.log.debug("release: the lock key was not ours any more")
                else:
                    b.released(int(freed) - 1)
                return
            except Exception as exc:
                b.log.debug("release failed (%s); the key expires within the lease", b.describe(exc))
        await b.drop_lock_connection()


class RedisBackend(Backend):
    """Elections on one Redis server, built from a ``redis://`` or ``rediss://`` URL and :class:`RedisOptions`
    (``redis+sentinel://``: the master a Sentinel names; ``redis+cluster://``: the master of a Redis Cluster that
    owns the election's slot, see :mod:`._cluster`).

    The constructor validates every option (ValueError naming it, never the
    password) and connects to nothing.
    """

    kind = "redis"

    def __init__(self, url: str, **options: Unpack[RedisOptions]) -> None:
        if not isinstance(url, str):
            raise ValueError("RedisElector needs a URL: redis://user:password@host:port/db")
        settings = RedisSettings.parse(url, dict(options))
        super().__init__(settings.name)
        self.settings = settings
        self.timing = settings.timing
        self.lease_ms = max(1, round(settings.timing.lease * 1000))
        self.tokens_may_repeat = settings.volatile_tokens
        self.observe_interval = max(settings.timing.poll_interval, 0.1)
        warning = settings.warning()
        if warning is not None:
            self.warnings.append(warning)
        self._lock: Redis | None = None
        self._look: Redis | None = None
        self._state: Redis | None = None
        #: The lock client whose server's settings and role were read and allowed, before any script on it.
        self._checked: Redis | None = None
        #: Until when a new campaign lets waiters go first after this elector's release (monotonic; 0: no wait),
        #: and at most how long: as the file backend's handover.
        self._first_try_after = 0.0
        self._handover = min(2 * settings.timing.poll_interval, _MAX_HANDOVER)
        #: The last message a new campaign read from its kept subscription (None: none).
        self._last_published: str | None = None
        #: The campaigns' subscription and its client, kept across campaigns (see :meth:`_subscription`).
        self._sub: tuple[Redis, PubSub] | None = None
        self._version: tuple[int, ...] | None = None
        self._volatile_warned = False
        self._unchecked_warned = False
        self._failover_warned = False
        self._assumed_logged = False
        self._config_denied = False
        #: Whether writes need ``WAITAOF`` to be fsynced, as the last settings read said (fenced state's writes too).
        self._waitaof = False
        self._closed = False
        self._sentinels: dict[int, list[Redis]] = {}
        self._masters_named: set[str] = set()
        self._slot_owner: SlotOwner | None = None
        #: Handed every exchange with the server (each script, command, subscription and wait for a published
        #: message); None runs them directly.
        self.interceptor: Interceptor | None = None

    def __repr__(self) -> str:
        return f"<RedisBackend {self.settings.url} name={self.name!r}>"

    def intercept(self, interceptor: Interceptor | None) -> None:
        self.interceptor = interceptor

    @property
    def renew_deadline(self) -> float:
        return self.timing.renew_deadline

    @property
    def margin(self) -> float:
        """``lease - renew_deadline``: the key's expiry is the only bound once :func:`._bounds.config_problem`
        has found nothing that could delete it sooner."""
        return self.timing.margin

    def describe_timing(self) -> str:
        t = self.timing
        replicas = f" min_replicas={self.settings.min_replicas}" if self.settings.min_replicas else ""
        return (
            f"lease={t.lease:g}s (PX) check_interval={t.check_interval:g}s check_timeout={t.check_timeout:g}s "
            f"renew_deadline={t.renew_deadline:g}s poll_interval={t.poll_interval:g}s{replicas} "
            f"server={self.settings.url}: a released lock is taken at once (published), a crashed or cut-off "
            f"leader's key expires after {t.lease:g}s; a leader that cannot renew fences itself after "
            f"{t.renew_deadline:g}s, {t.lease - t.renew_deadline:.3g}s before its key can expire"
        )

    def reporter_error(self, what: str) -> None:
        self._reporter.error(what)

    # --- connections ------------------------------------------------------------------

    def _client(self) -> Redis:
        if self._closed:
            raise ElectionError("the Redis elector is closed")
        options = self.settings.client_options()
        if self.settings.cluster_nodes:
            return self._cluster_client(options)
        if not self.settings.sentinels:
            return Redis(**options, single_connection_client=True, decode_responses=True)
        from ._sentinel import sentinel_client

        client, sentinels = sentinel_client(self.settings, options, self._master_named)
        self._sentinels[id(client)] = sentinels
        return client

    def _master_named(self, host: str) -> None:
        """Log the transport WARNING, once per host, for a master a Sentinel names (:mod:`._sentinel`)."""
        if host not in self._masters_named:
            self._masters_named.add(host)
            warning = self.settings.master_warning(host)
            if warning is not None:
                self.log.warning("%s", warning)

    def _cluster_client(self, options: dict[str, Any]) -> Redis:
        """One connection to the master that owns the election's slot, asked of the cluster as it connects."""
        from redis.asyncio.connection import ConnectionPool

        from ._cluster import SlotConnection, SlotOwner, SlotSSLConnection

        # Asked as part of the exchange that opens the connection (an interceptor already sees that one); one
        # for the elector's life, so that it keeps asking the node that answered last.
        if self._slot_owner is None:
            self._slot_owner = SlotOwner(
                self.settings.cluster_nodes, self.settings.lock_key, options, self.settings.url
            )
        resolve = self._slot_owner
        del options["host"], options["port"]
        tls = bool(options.pop("ssl", False))
        pool = ConnectionPool(
            connection_class=SlotSSLConnection if tls else SlotConnection,
            resolve=resolve,
            decode_responses=True,
            **options,
        )
        return Redis(connection_pool=pool, single_connection_client=True, decode_responses=True)

    async def _close(self, client: Redis) -> None:
        """Close ``client`` with its pool, and the connections to the sentinels it asked."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.timing.check_timeout):
            await client.aclose(close_connection_pool=True)
            for asked in self._sentinels.pop(id(client), []):
                await asked.aclose()

    def lock_client(self) -> Redis:
        """The one connection campaigns and the hold use (``WAIT`` follows the grant on it)."""
        if self._lock is None:
            self._lock = self._bounded(self._client())
        return self._lock

    def look_client(self) -> Redis:
        """The connection :meth:`leader` and :meth:`observe` use, closed by :meth:`close_observer`."""
        if self._look is None:
            self._look = self._bounded(self._client())
        return self._look

    def _bounded(self, client: Redis) -> Redis:
        """``client`` and the sentinels it asks, each reply read within :data:`._replies.MAX_REPLY` bytes."""
        for asked in self._sentinels.get(id(client), []):
            bounded(asked)
        return bounded(client)

    def _new_state_store(self) -> StateStore:
        return RedisStateStore(self, self.settings.token_key, f"{self.settings.key_prefix}{{{self.name}}}:state")

    def state_client(self) -> Redis:
        """The connection fenced state is read and written on, opened on first use, closed with the backend."""
        if self._state is None:
            self._state = self._bounded(self._client())
        return self._state

    async def drop_state_client(self) -> None:
        client, self._state = self._state, None
        if client is not None:
            await self._close(client)

    def failure(self, exc: BaseException, what: str) -> ElectionError:
        """What to raise for ``exc``, caught while doing ``what``: refused (no retry can fix it) or unreachable."""
        return self._refusal(exc, what) if self.permanent(exc) else self._unreachable(exc)

    async def drop_lock_connection(self) -> None:
        """Close the lock connection (the next request opens a new one): an idle elector holds nothing."""
        client, self._lock = self._lock, None
        if client is not None:
            await self._close(client)

    def lock_address(self) -> tuple[str, int] | None:
        """The address the lock connection is connected to now, or None."""
        client = self._lock
        conn = client.connection if client is not None else None
        if conn is None or not conn.is_connected:
            return None
        return str(conn.host), int(conn.port)

    async def named_master(self, client: Redis) -> tuple[str, int] | None:
        """The master a majority of the configured sentinels (``len(sentinels) // 2 + 1``; with one configured, that
        one) name for ``client``, every one asked at once. None: one that answers holds that master down, names
        none or does not know it, or no address has a majority (they disagree, or a minority names one); raises
        when fewer than a majority answer, so that a minority cut off with an abandoned master confirms nothing.
        Only for a ``redis+sentinel://`` client."""
        manager = client.connection_pool.sentinel_manager  # type: ignore[attr-defined]
        name = self.settings.master_name
        majority = len(self.settings.sentinels) // 2 + 1
        errors: list[str] = []
        named: list[tuple[str, int] | None] = []

        async def ask_one(sentinel: Redis) -> None:
            def ask() -> Awaitable[Any]:
                asked: Any = sentinel.sentinel_master  # typed otherwise by each redis-py release
                return asked(name)  # type: ignore[no-any-return]

            state: Any = None
            for attempt in (1, 2):
                try:
                    state = await self.send("ask sentinels", ask)
                    break
                except rexc.ResponseError:  # this sentinel does not know the master
                    named.append(None)
                    return
                except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
                    # A connection the sentinel closed (it does on a failover) is opened again, once.
                    closed = isinstance(exc, rexc.ConnectionError) and not isinstance(exc, rexc.AuthenticationError)
                    if attempt == 2 or not closed:
                        errors.append(self.describe(exc))
                        return
            if not isinstance(state, dict) or not state.get("is_master") or state.get("is_odown"):
                named.append(None)
            else:
                named.append((str(state["ip"]), int(state["port"])))

        async with anyio.create_task_group() as tg:
            for sentinel in list(manager.sentinels):
                tg.start_soon(ask_one, sentinel)
        if len(named) < majority:
            raise rexc.ConnectionError(
                f"{len(named)} of {len(self.settings.sentinels)} sentinels answered, not a majority of {majority} "
                f"({'; '.join(errors) or 'none listed'})"
            )
        if None in named:
            return None
        for address in set(named):
            if named.count(address) >= majority:
                return address
        return None

    async def _still_named(self, client: Redis, *, required: bool = False) -> None:
        """Through Sentinel: raise :class:`_NotMaster` if the sentinels name another master than the one
        ``client`` is connected to, or hold it down; when no sentinel answers, no opinion unless ``required``
        (a grant: the master may have been abandoned in a failover that its replicas have not all followed)."""
        if not self.settings.sentinels:
            return
        try:
            with anyio.fail_after(self.timing.check_timeout):
                named = await self.named_master(client)
        except Exception as exc:
            if required:
                raise _NotMaster(f"no majority of the sentinels confirmed the master ({self.describe(exc)})") from None
            self.log.debug("asking the sentinels failed (%s)", self.describe(exc))
            return
        here = self.lock_address() if client is self._lock else None
        if named is None:
            raise _NotMaster(
                "the sentinels hold the master down (a failover is under way), or no majority of them names it"
            )
        if here is not None and here != named:
            raise _NotMaster(f"the sentinels name {named[0]}:{named[1]} as the master, not {here[0]}:{here[1]}")

    async def _pipelined(self, client: Redis, *commands: tuple[str | int, ...]) -> list[Any]:
        """Send ``commands`` in one write on ``client``'s connection and read every reply in order: one round trip.
        An error reply is returned in its place as its exception; a connection error is raised."""
        await client.initialize()
        conn = client.connection
        assert conn is not None  # a single-connection client
        replies: list[Any] = []
        try:
            await conn.send_packed_command(conn.pack_commands(commands))
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except rexc.ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            # Replies may still be on their way (a timeout, a cancellation): the next request must not read them.
            with anyio.CancelScope(shield=True):
                await conn.disconnect(nowait=True)
            raise
        return replies

    async def renew(self, owner: str, replicas: frozenset[str], expect: int) -> Renewal:
        """One renew: the script, then (with ``min_replicas``) ``WAIT`` for every replica the master listed last
        (``expect``, at least ``min_replicas``), then ``ROLE`` and ``INFO replication`` (every replica the master
        knows of, one in its first sync too), sent together in one round trip."""
        client = self.lock_client()
        keys = (self.settings.lock_key, self.settings.token_key)
        wanted = self.settings.min_replicas
        timeout_ms = max(1, round(self.timing.check_timeout * 500))
        script: tuple[str | int, ...] = ("EVALSHA", _SHA[RENEW], 2, *keys, owner, self.lease_ms, self.settings.channel)
        waited: tuple[tuple[str | int, ...], ...] = (("WAIT", max(wanted, expect), timeout_ms),) if wanted else ()

        async def exchange() -> list[Any]:
            replies = await self._pipelined(client, script, *waited, *_ROLE_AND_INFO)
            if isinstance(replies[0], rexc.NoScriptError):
                replies = await self._pipelined(client, ("EVAL", RENEW, *script[2:]), *waited, *_ROLE_AND_INFO)
            return replies

        replies = await self.send("renew", exchange)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        listed = _all_replicas(replies[-2], replies[-1])
        if listed is None:
            role = replies[-2][0] if isinstance(replies[-2], list) and replies[-2] else replies[-2]
            return Renewal(bool(int(replies[0])), None, f"the server is no longer a master (ROLE: {role})", True)
        mine = bool(int(replies[0]))
        if not mine or not wanted:
            return Renewal(mine, listed)
        got = int(replies[1])
        gone = replicas - listed
        if gone:
            return Renewal(
                True, listed, f"replica {', '.join(sorted(gone))} left the master: it may have been promoted", False
            )
        need = max(wanted, len(listed))
        if got < need:
            return Renewal(
                True, listed, f"{got} of {need} replicas confirmed the renew in time (WAIT; min_replicas={wanted})"
            )
        return Renewal(True, listed)

    def send(self, what: str, call: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
        """``call()``, through the :attr:`interceptor` if there is one (``what`` names the exchange)."""
        interceptor = self.interceptor
        if interceptor is None:
            return call()
        return interceptor.exchange(what, call)

    async def run_script(self, client: Redis, script: str, *args: str | int) -> Any:
        """Run ``script`` on the election's two keys (by its digest; sent whole when the server lacks it)."""
        interceptor = self.interceptor
        if interceptor is None:
            return await self._script(client, script, args)
        return await interceptor.exchange(_WHAT[script], lambda: self._script(client, script, args))

    async def _script(self, client: Redis, script: str, args: tuple[str | int, ...]) -> Any:
        keys = (self.settings.lock_key, self.settings.token_key)
        try:
            # redis-py types keys and arguments as one list before 5.1, as varargs after.
            return await client.evalsha(_SHA[script], 2, *keys, *args)  # type: ignore[arg-type, misc, unused-ignore]
        except rexc.NoScriptError:
            return await client.eval(script, 2, *keys, *args)  # type: ignore[arg-type, misc, unused-ignore]

    # --- errors -----------------------------------------------------------------------

    def permanent(self, exc: BaseException) -> bool:
        """Whether no retry can fix ``exc``: credentials (``WRONGPASS``), ACL (``NOPERM``), a refused certificate,
        a database number out of range, ``WRONGTYPE`` on the election's keys, a script error, an unknown command;
        and our own refusals (persistence, server settings). A connection refused, reset or timed out, and the
        replies of :data:`_TRANSIENT_REPLIES`, are transient."""
        if isinstance(exc, (rexc.AuthenticationError, rexc.NoPermissionError)):
            return True
        if _tls_verify_error(exc) is not None:
            return True
        # redis-py strips these replies' codes (READONLY, LOADING, TRYAGAIN, MASTERDOWN, OOM, CLUSTERDOWN) from
        # their messages: known by their classes.
        if isinstance(exc, _TRANSIENT_CLASSES):
            return False
        if isinstance(exc, rexc.ResponseError):
            return not str(exc).startswith(_TRANSIENT_REPLIES)
        return isinstance(exc, ElectionError)

    def describe(self, exc: BaseException) -> str:
        """``exc`` in words; redis-py and Redis never put the password in theirs."""
        if isinstance(exc, (TimeoutError, rexc.TimeoutError)):
            return "timed out"
        tls = _tls_verify_error(exc)
        if tls is not None:
            text = f"TLS handshake failed: {getattr(tls, 'verify_message', None) or tls.reason or tls}"
            if self.settings.sentinels:
                text += (
                    " (a master a Sentinel names must hold a certificate for master_tls_name, else for its address "
                    "as master_hosts lists it, else for the master's name in the URL)"
                )
            return text
        text = str(exc) or type(exc).__name__
        return f"{type(exc).__name__}: {text}" if isinstance(exc, rexc.RedisError) else text

    def _refusal(self, exc: BaseException, what: str) -> ElectionError:
        if isinstance(exc, ElectionError):  # our own refusal (persistence, settings), or the elector closed
            return exc
        return PermanentBackendError(f"Redis at {self.settings.url} refused {what}: {self.describe(exc)}")

    async def _unmonitored(self, client: Redis | None, exc: BaseException) -> BackendMisconfigured | None:
        """For a Sentinel's "no master found" (``exc``): BackendMisconfigured when a Sentinel of ``client``
        answers and none that answers monitors a master of that name; else None (a master down or failing over
        is transient)."""
        from redis.asyncio.sentinel import MasterNotFoundError

        if not isinstance(exc, MasterNotFoundError):
            return None
        monitored: set[str] = set()
        answers = 0
        for sentinel in self._sentinels.get(id(client), []):
            try:
                with anyio.fail_after(self.timing.check_timeout):
                    masters = await self.send("list masters", sentinel.sentinel_masters)
            except Exception:
                continue  # this one is down: the others decide
            if self.settings.master_name in masters:
                return None
            answers += 1
            monitored.update(str(name) for name in masters)
        if not answers:
            return None
        listed = ", ".join(sorted(monitored)) or "none"
        return BackendMisconfigured(
            f"no Sentinel at {self.settings.url} monitors a master named {self.settings.master_name!r}: the "
            f"Sentinels answer, and they do not monitor it (they monitor: {listed}); check the master name in "
            "the URL (redis+sentinel://host:port/MASTER/db)"
        )

    def _unreachable(self, exc: BaseException) -> BackendUnavailable:
        return BackendUnavailable(f"Redis at {self.settings.url} is unreachable: {self.describe(exc)}")

    # --- durability of the tokens -----------------------------------------------------

    def _settings_reads(self) -> tuple[tuple[str, ...], ...]:
        """What every campaign try reads beside its acquire script, in the same round trip: ``INFO`` (the version,
        whether the append-only file is on, the eviction settings) and, unless the URL states them or this user was
        denied it, ``CONFIG GET appendfsync timeout``. A user allowed ``CONFIG GET`` can read the server's passwords
        too, so the documented ACL denies it: asked until the first denial (each is an entry in the ACL LOG)."""
        reads: list[tuple[str, ...]] = [("INFO", "server", "persistence", "memory")]
        stated = dict(self.settings.assume_config)
        unread = [key for key in CONFIG_READ if key not in stated]
        if unread and not self._config_denied:
            reads.append(("CONFIG", "GET", *unread))
        return tuple(reads)

    def _judge_settings(self, replies: list[Any]) -> bool:
        """Whether the grant needs ``WAITAOF``, from the replies to :meth:`_settings_reads`.

        PermanentBackendError if a server setting could let the key go before its expiry, or keep a healthy
        leader's renews from coming in time (:func:`._bounds.config_problem`), or if tokens cannot be durable
        (unless ``volatile_tokens``, then logged once at WARNING).
        """
        info = replies[0]
        if isinstance(info, Exception):
            raise info
        fields = _info_fields(info)
        version = fields.get("redis_version", "0")
        self._version = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        config = {
            "appendonly": "yes" if fields.get("aof_enabled") == "1" else "no",
            "maxmemory": fields.get("maxmemory", "0"),
            "maxmemory-policy": fields.get("maxmemory_policy", "noeviction"),
        }
        stated = dict(self.settings.assume_config)
        if stated and not self._assumed_logged:
            self._assumed_logged = True
            self.log.info(
                "not read from the server, as the URL states them: %s",
                ", ".join(f"{key} {value}" for key, value in stated.items()),
            )
        if len(replies) > 1:
            reply = replies[1]
            if isinstance(reply, rexc.NoPermissionError):
                self._config_denied = True
            elif isinstance(reply, Exception):
                raise reply
            else:
                pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=False)
                config.update({str(k): str(v) for k, v in pairs})
        config.update(stated)
        if "timeout" not in config and not self._unchecked_warned:
            self._unchecked_warned = True
            self.log.warning(
                "the server's timeout is unknown (CONFIG GET is denied to this user, and the URL does not state it "
                "with assume_timeout=): renews come in time only with timeout 0 or at least %gs",
                least_timeout(self.timing),
            )
        problem = config_problem(config, self.timing, server=self.settings.url)
        if problem is not None:
            raise PermanentBackendError(problem)
        self._waitaof = self._judge_fsync(config)
        return self._waitaof

    def _judge_fsync(self, config: dict[str, str]) -> bool:
        """Whether a write needs ``WAITAOF`` under ``config``; PermanentBackendError if tokens cannot be durable."""
        waitaof = (self._version or ()) >= (7, 2)
        if config["appendonly"] == "yes" and config.get("appendfsync") == "always":
            return False
        if waitaof and config["appendonly"] == "yes":
            return True
        if config["appendonly"] != "yes":
            why = "the server runs without the append-only file (appendonly no)"
        elif "appendfsync" not in config:
            why = (
                "CONFIG GET is denied to this user and the URL does not state appendfsync (assume_appendfsync=always), "
                "so how often the append-only file is synced is unknown"
            )
        else:
            why = f"the append-only file is synced {config.get('appendfsync')!r}, not 'always'"
        what = (
            f"{why} (Redis {'.'.join(map(str, self._version or ())) or 'version unknown'}; WAITAOF needs 7.2): "
            "a server crash can lose the last token increment, and the next leader would get a token already "
            "handed out"
        )
        if not self.settings.volatile_tokens:
            raise PermanentBackendError(
                f"Redis at {self.settings.url} cannot keep fencing tokens across a crash: {what}. Set appendonly yes "
                "and appendfsync always (and state it with ?assume_appendfsync=always, or use Redis 7.2+), or pass "
                "volatile_tokens=True (the aioelect command: --allow-volatile-tokens, "
                "AIOELECT_ALLOW_VOLATILE_TOKENS=1) to accept tokens that may repeat"
            )
        if not self._volatile_warned:
            self._volatile_warned = True
            self.log.warning("volatile_tokens=True: %s; fencing tokens may repeat after a server crash", what)
        return False

    async def _confirm_write(self, client: Redis, waitaof: bool) -> frozenset[str]:
        """Raise :class:`_NotConfirmed` unless the grant is fsynced (``WAITAOF``) and, with ``min_replicas``, on
        every replica the master knows of and on at least ``min_replicas``; the replicas that have it."""
        timeout_ms = max(1, round(self.timing.check_timeout * 500))
        if waitaof:
            local, _ = await self.send("waitaof", lambda: _command(client, "WAITAOF", 1, 0, timeout_ms))
            if int(local) < 1:
                raise _NotConfirmed("the server did not confirm the token's fsync (WAITAOF) in time")
        wanted = self.settings.min_replicas
        if not wanted:
            return frozenset()
        before = await self._replicas_known(client)
        need = max(wanted, len(before or ()))
        got = int(await self.send("wait replicas", lambda: _command(client, "WAIT", need, timeout_ms)))
        after = await self._replicas_known(client)
        if before is None or after is None:
            raise _NotMaster("the server is not a master (ROLE)")
        if got < wanted:
            raise _NotConfirmed(f"only {got} of min_replicas={wanted} replicas confirmed the grant (WAIT)")
        if got < len(after) or before - after:
            raise _NotConfirmed(
                f"{got} of the {len(after)} replicas the master knows of (one still in its first sync included) "
                "confirmed the grant (WAIT): with min_replicas every replica a failover could promote must have it"
            )
        return after

    async def confirm_state_write(self, client: Redis) -> None:
        """A fenced state write just done on ``client``, confirmed as a grant is (:meth:`_confirm_write`): fsynced
        when the settings need ``WAITAOF``, and with ``min_replicas`` on every replica a failover could promote, so
        that a failover that keeps the token keeps the value too. Raises if not confirmed (the write may stand)."""
        await self._confirm_write(client, self._waitaof)

    async def _replicas_known(self, client: Redis) -> frozenset[str] | None:
        """Every replica the master knows of (``ROLE`` and ``INFO replication``), or None if it is not a master."""
        role = await self.send("read role", lambda: _command(client, "ROLE"))
        info = await self.send("read replication", lambda: _command(client, "INFO", "replication"))
        return _all_replicas(role, info)

    def _judge_role(self, role: Any) -> None:
        """A try's ``ROLE`` reply: a user denied ``ROLE`` (which every renew sends) is refused here, before it leads;
        a server that is not a master raises :class:`_NotMaster` (transient: the retry's new connection asks again)."""
        if isinstance(role, Exception):
            raise role
        if _replica_set(role) is None:
            shown = role[0] if isinstance(role, list) and role else role
            raise _NotMaster(f"the server is a {shown}, not a master")

    async def _warn_failover(self, client: Redis) -> None:
        """``min_replicas=0`` through Sentinel or on a Redis Cluster is logged once at WARNING, with what the
        server's ``min-replicas-to-write`` (seen in ``INFO replication``) bounds."""
        failover = bool(self.settings.sentinels or self.settings.cluster_nodes)
        if not failover or self.settings.min_replicas or self._failover_warned:
            return
        self._failover_warned = True
        info = await self.send("read replication", lambda: _command(client, "INFO", "replication"))
        guarded = isinstance(info, dict) and "min_slaves_good_slaves" in info  # only with min-replicas-to-write
        self.log.warning(
            "min_replicas=0 %s: a renew is not confirmed by any replica, so a master cut off from %s keeps "
            "accepting the leader's renews after a replica is promoted, and two leaders can act until the old "
            "master is demoted%s; pass min_replicas=1 or more",
            "through Sentinel" if self.settings.sentinels else "on a Redis Cluster",
            "the sentinels" if self.settings.sentinels else "the cluster bus",
            " or refuses writes (its min-replicas-to-write stops them min-replicas-max-lag seconds after its "
            "replicas left)"
            if guarded
            else "",
        )

    # --- campaign ---------------------------------------------------------------------

    async def _try(self, client: Redis, owner: str, identity: str) -> tuple[RedisHold | None, str | None, int]:
        """One campaign try: (the hold or None, the key's value, its PTTL in ms).

        One round trip: the server's settings (:meth:`_settings_reads`), ``ROLE`` and the acquire script, sent
        together. A grant stands only once the settings read with it allow it (else the key is withdrawn and the
        refusal raised); the script itself grants only on a master. The first try on a connection reads the
        settings and ``ROLE`` alone first.
        """
        await self._warn_failover(client)
        reads = self._settings_reads()
        if self._checked is not client:
            # A new connection: its server's settings and role are read first, so that a server refused by them
            # is never sent a write; from then on they are read again with every script.
            checked = await self.send("read persistence", lambda: self._pipelined(client, *reads, ("ROLE",)))
            self._judge_settings(checked[:-1])
            self._judge_role(checked[-1])
            self._checked = client
            reads = self._settings_reads()  # a CONFIG GET denied just now is not asked again
        # Asked before the script too: a master they do not name (yet) is not sent an INCR that would be withdrawn.
        await self._still_named(client, required=True)
        args = (self.settings.lock_key, self.settings.token_key, owner, identity, self.lease_ms, self.settings.channel)

        async def exchange() -> list[Any]:
            replies = await self._pipelined(client, *reads, ("ROLE",), ("EVALSHA", _SHA[ACQUIRE], 2, *args))
            if isinstance(replies[-1], rexc.NoScriptError):
                replies = await self._pipelined(client, *reads, ("ROLE",), ("EVAL", ACQUIRE, 2, *args))
            return replies

        sent = monotonic()
        replies = await self.send("acquire", exchange)
        _cancel_if_swallowed()  # never a grant to a cancelled task: the caller withdraws the key
        granted = False
        try:
            reply = replies[-1]
            if isinstance(reply, Exception):
                raise reply
            token, value, pttl = self._acquire_reply(reply)
            granted = token > 0
            waitaof = self._judge_settings(replies[: len(reads)])
            self._judge_role(replies[len(reads)])
            if token < 0:
                raise _NotMaster(f"the server is a {value}, not a master")
            if not token:
                return None, value, pttl
            replicas = await self._confirm_write(client, waitaof)
            await self._still_named(client, required=True)
        except BaseException:
            if granted:
                await self._withdraw(owner)
            raise
        _cancel_if_swallowed()
        return RedisHold(self, owner, token, sent, replicas), value, pttl

    def _acquire_reply(self, reply: Any) -> tuple[int, str | None, int]:
        """The acquire script's ``{token, value, pttl}``; PermanentBackendError for a reply of any other shape."""
        if isinstance(reply, list) and len(reply) == 3:
            token, value, pttl = reply
            if isinstance(token, int) and isinstance(pttl, int) and (value is None or isinstance(value, str)):
                return token, value, pttl
        shown = repr(reply) if len(repr(reply)) <= 80 else repr(reply)[:80] + "..."
        raise PermanentBackendError(
            f"Redis at {self.settings.url} answered the acquire script with {shown}, not {{token, value, pttl}}"
        )

    async def _withdraw(self, owner: str) -> None:
        """Delete our key if a request of ours may have set it; bounded, never interrupted."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.timing.check_timeout + 1):
            try:
                await self.run_script(self.lock_client(), RELEASE, owner, self.settings.channel)
            except Exception as exc:
                self.log.debug("withdrawing a campaign's key failed (%s); it expires within the lease", exc)

    async def campaign(self, identity: str) -> Hold:
        owner = secrets.token_hex(8) + ":"
        backoff = Backoff(first=0.1, maximum=max(self.timing.poll_interval, 1.0))
        pubsub: PubSub | None = None
        won = uncertain = False
        try:
            while True:
                client = self.lock_client()
                try:
                    if pubsub is None:
                        # Subscribed before the first try: a release published after it wakes us.
                        pubsub = await self._subscription()
                        granted = await self._let_waiters_go_first(pubsub)
                        if granted:  # a waiter leads now: no try until its key is gone or released
                            self._reporter.leader(identity_of(granted))
                            await self._wait_turn(client, pubsub, 0)
                    uncertain = True
                    hold, value, pttl = await self._try(client, owner, identity)
                    uncertain = False
                    if hold is not None:
                        won = True
                        return hold
                    backoff.reset()
                    self._reporter.leader(identity_of(value))
                    await self._wait_turn(client, pubsub, pttl)
                except Exception as exc:
                    unknown = await self._unmonitored(client, exc)
                    if unknown is not None:
                        raise unknown from None
                    if self.permanent(exc):
                        raise self._refusal(exc, "the campaign") from None
                    delay = backoff.next_delay()
                    self.report_error(f"campaign interrupted ({self.describe(exc)})", delay)
                    # New connections for the next try (through Sentinel: to the master it names now); a try
                    # that may have set our key is recognised by the next one (same owner), or withdrawn below.
                    pubsub = None
                    await self._close_subscription()
                    await self.drop_lock_connection()
                    await anyio.sleep(delay)
        finally:
            if not won:
                await self._close_subscription()
                if uncertain:
                    await self._withdraw(owner)
                await self.drop_lock_connection()

    async def _wait_turn(self, client: Redis, pubsub: PubSub, pttl: int) -> None:
        """Until the next try is due: a release published on the election's channel, or the key gone.

        Every release is published, so a subscribed waiter tries at once after each; a grant is published too
        (its value: the new leader, reported at once). Nothing is published when the key expires (its leader
        crashed or was cut off): the waiter sleeps until the key can have expired (``pttl``), or a grant was
        published, then reads its expiry alone (``PTTL``: one command, no try), as many times as a leader's
        renews set it again, and tries once it is gone. A key without an expiry (not the election's: an
        operator's) is read again every ``poll_interval``.
        """
        while pttl != -2:
            # A waiter follows a failover: on a master the sentinels no longer name, it asks again.
            await self._still_named(client)
            wait = self.timing.poll_interval if pttl < 0 else min(pttl / 1000, self.timing.lease)
            published = await self._wait_change(pubsub, max(wait, 0.001))
            if published == "":
                return
            if published is not None:
                self._reporter.leader(identity_of(published))
            pttl = int(await self.send("read expiry", lambda: _command(client, "PTTL", self.settings.lock_key)))

    def released(self, heard: int) -> None:
        """This elector's release was published to ``heard`` subscribers: with another one among them (a waiting
        candidate, or an observer), its next campaign lets a waiter go first (:meth:`_let_waiters_go_first`)."""
        others = heard - (1 if self._sub is not None else 0)
        self._first_try_after = monotonic() + self._handover if others > 0 else 0.0

    async def _let_waiters_go_first(self, pubsub: PubSub) -> str | None:
        """A campaign that starts within ``min(2 * poll_interval, 0.25 s)`` of this elector's own release, heard by
        another subscriber, waits that long at most for a waiter's grant to be published before its first try: the
        releaser, whose try would be sent before any waiter has woken, does not take the leadership straight back.
        The grant's value if one was published since that release, else None."""
        left = self._first_try_after - monotonic()
        self._first_try_after = 0.0
        if self._last_published:
            return self._last_published  # a grant published since our release (read from the kept subscription)
        if left <= 0:
            return None
        started = monotonic()
        published = await self._wait_change(pubsub, left)
        self.log.debug("let waiting candidates go first for %.1f ms", (monotonic() - started) * 1000)
        return published or None

    async def _subscription(self) -> PubSub:
        """The subscription to the election's channel, on a connection of its own kept across campaigns (closed
        after an error, by a campaign that ends without leading, and by :meth:`aclose`). Messages published
        while no campaign read it (this elector's own grant and release) are read and dropped first."""
        self._last_published = None
        if self._sub is not None:
            kept = self._sub[1]

            def read() -> Awaitable[Any]:
                return kept.get_message(ignore_subscribe_messages=True, timeout=0)

            try:
                for _ in range(_DRAINED):
                    message = await self.send("release message", read)
                    if message is None:
                        break
                    data = message.get("data") if isinstance(message, dict) else None
                    self._last_published = data if isinstance(data, str) else ""
                return kept
            except Exception as exc:
                # Not read for as long as this elector led: a server restart or a timeout may have closed it.
                self.log.debug("the kept subscription was lost (%s); subscribing again", self.describe(exc))
                await self._close_subscription()
        client = self._bounded(self._client())
        pubsub = client.pubsub()
        self._sub = (client, pubsub)
        await self._subscribe(pubsub)
        return pubsub

    async def _close_subscription(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            await self._close_pubsub(sub[1])
            await self._close(sub[0])

    async def try_campaign(self, identity: str) -> Hold | None:
        owner = secrets.token_hex(8) + ":"
        hold: RedisHold | None = None
        answered = False
        try:
            hold, value, _ = await self._try(self.lock_client(), owner, identity)
            answered = True
        except Exception as exc:
            unknown = await self._unmonitored(self._lock, exc)
            if unknown is not None:
                raise unknown from None
            if self.permanent(exc):
                raise self._refusal(exc, "the campaign") from None
            raise self._unreachable(exc) from None
        finally:
            if hold is None:
                if not answered:
                    await self._withdraw(owner)
                await self.drop_lock_connection()
        if hold is None:
            self._reporter.leader(identity_of(value))
        return hold

    async def _subscribe(self, pubsub: PubSub) -> None:
        """Subscribe ``pubsub`` to the election's channel and read the server's confirmation (from then on every
        message published is delivered to it), within connect_timeout + check_timeout."""

        async def subscribe() -> None:
            await pubsub.subscribe(self.settings.channel)
            while True:
                message = await pubsub.get_message(timeout=self.timing.check_timeout)
                if isinstance(message, dict) and message.get("type") == "subscribe":
                    return

        with anyio.fail_after(self.timing.connect_timeout + self.timing.check_timeout):
            await self.send("subscribe", subscribe)

    async def _wait_change(self, pubsub: PubSub, wait: float) -> str | None:
        """Until a message on the election's channel (its data: a grant's value, "" for a release), or ``wait``
        seconds (None)."""

        def read() -> Awaitable[Any]:
            return pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)

        with anyio.move_on_after(wait):
            while (message := await self.send("release message", read)) is None:
                await anyio.lowlevel.checkpoint()  # a reply that was only a confirmation must not spin the loop
            data = message.get("data") if isinstance(message, dict) else None
            return data if isinstance(data, str) else ""
        return None

    async def _close_pubsub(self, pubsub: PubSub) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.timing.check_timeout):
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
            except Exception as exc:
                self.log.debug("closing the subscription failed (%s)", exc)

    # --- who leads --------------------------------------------------------------------

    async def leader(self) -> str | None:
        try:
            client = self.look_client()
            value = await self.send("read leader", lambda: client.get(self.settings.lock_key))
            assert value is None or isinstance(value, str)  # decode_responses
        except Exception as exc:
            unknown = await self._unmonitored(self._look, exc)
            await self._drop_look()
            if unknown is not None:
                raise unknown from None
            if self.permanent(exc):
                raise self._refusal(exc, "the query") from None
            raise self._unreachable(exc) from None
        return identity_of(value)

    async def observe(self) -> AsyncIterator[str | None]:
        """The leader now and at each change: woken at once by a grant or release, read every ``observe_interval``."""
        last: object = object()
        backoff = Backoff(first=self.observe_interval, maximum=max(5.0, self.observe_interval))
        pubsub: PubSub | None = None
        try:
            while True:
                try:
                    if pubsub is None:
                        pubsub = self.look_client().pubsub()
                        await self._subscribe(pubsub)
                    current = await self.leader()
                except (BackendUnavailable, rexc.RedisError, OSError, TimeoutError) as exc:
                    if isinstance(exc, rexc.RedisError) and self.permanent(exc):
                        raise self._refusal(exc, "the subscription") from None
                    delay = backoff.next_delay()
                    self.log.warning("observe: %s; retrying in %.1fs", self.describe(exc), delay)
                    if pubsub is not None:
                        await self._close_pubsub(pubsub)
                        pubsub = None
                    await anyio.sleep(delay)
                    continue
                backoff.reset()
                if current != last:
                    last = current
                    yield current
                try:
                    await self._wait_change(pubsub, self.observe_interval)
                except (rexc.RedisError, OSError) as exc:
                    self.log.debug("observe: subscription lost (%s); subscribing again", self.describe(exc))
                    await self._close_pubsub(pubsub)
                    pubsub = None
        finally:
            if pubsub is not None:
                await self._close_pubsub(pubsub)

    async def watch(self) -> AsyncIterator[str | None]:
        """Nothing of its own: every try of a campaign reads the holder and reports it (woken by each change)."""
        await anyio.sleep_forever()
        yield None  # pragma: no cover - never reached

    async def _drop_look(self) -> None:
        client, self._look = self._look, None
        if client is not None:
            await self._close(client)

    async def close_observer(self) -> None:
        await self._drop_look()

    async def aclose(self) -> None:
        self._closed = True
        await self._drop_look()
        await self.drop_state_client()
        await self._close_subscription()
        await self.drop_lock_connection()
