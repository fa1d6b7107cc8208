"""One description per backend, so the contract suite runs against each of them.

A new backend adds one ``BackendCase`` builder here and inherits every
contract test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

from aioelect import Elector, Leadership


@dataclass
class BackendCase:
    kind: str
    #: Builds a candidate: make(name, identity=..., **backend options).
    make: Callable[..., Elector]
    #: True when candidates exclude each other (local does not).
    exclusive: bool = True
    #: How many server-side resources (connections, keys, leases) remain; None: cannot tell.
    leftovers: Callable[[], Awaitable[int]] | None = None
    #: Takes leadership away from the current leader from outside (KILL, revoke...).
    depose: Callable[[Elector], Awaitable[None]] | None = None
    #: A generous bound for takeover after a release, in seconds.
    takeover_bound: float = 1.0
    #: Yields a ``make`` whose candidates meet in a store nothing has used yet
    #: (a new database or directory), and removes that store afterwards.
    empty_store: Callable[[], contextlib.AbstractAsyncContextManager[Callable[..., Elector]]] | None = None


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


async def handover_delays(
    a: Elector, b: Elector, *, rounds: int, pause: tuple[float, float], consecutive: bool = True
) -> list[float]:
    """Pass leadership between ``a`` and ``b`` ``rounds`` times; return how long each takeover took.

    The leader releases after a random pause in ``pause`` (so at a random phase of the
    other's wait); each successor must be the other candidate, with the next token
    (``consecutive``) or a larger one.
    """
    delays: list[float] = []
    won: asyncio.Queue[tuple[float, Leadership, asyncio.Event]] = asyncio.Queue()

    async def candidate(elector: Elector) -> None:
        while True:
            lead = await elector.acquire()
            handed_on = asyncio.Event()
            await won.put((time.monotonic(), lead, handed_on))
            await handed_on.wait()
            await asyncio.sleep(0.1)  # campaign again only once the other candidate has taken over

    async with anyio.create_task_group() as tg:
        tg.start_soon(candidate, a)
        tg.start_soon(candidate, b)
        _, lead, handed_on = await won.get()
        for _ in range(rounds):
            await asyncio.sleep(random.uniform(*pause))
            released = time.monotonic()
            await lead.release()
            handed_on.set()
            at, successor, handed_on = await won.get()
            delays.append(at - released)
            assert successor.identity != lead.identity
            if consecutive:
                assert successor.token == (lead.token or 0) + 1
            else:
                assert successor.token is not None and successor.token > (lead.token or 0)
            lead = successor
        tg.cancel_scope.cancel()
    return delays


def with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


def database_store(
    dsn: str, query: Callable[[str], object], make: Callable[..., Elector]
) -> Callable[[], contextlib.AbstractAsyncContextManager[Callable[..., Elector]]]:
    """A new database on the server for each use, dropped afterwards."""

    @contextlib.asynccontextmanager
    async def store() -> AsyncIterator[Callable[..., Elector]]:
        database = f"aioelect_empty_{secrets.token_hex(4)}"
        await anyio.to_thread.run_sync(query, f"CREATE DATABASE {database}")
        try:
            yield lambda name, **kw: make(name, dsn=with_database(dsn, database), **kw)
        finally:
            await anyio.to_thread.run_sync(query, f"DROP DATABASE {database}")

    return store


class Follower:
    """Campaigns in its own task, which then holds the leadership (it is bound to that task) until closed."""

    def __init__(self, elector: Elector) -> None:
        self.won = asyncio.Event()
        self.lead: Leadership | None = None
        self.task = asyncio.create_task(self._run(elector))

    async def _run(self, elector: Elector) -> None:
        self.lead = await elector.acquire()
        self.won.set()
        await asyncio.sleep(3600)

    async def wait(self, timeout: float = 5.0) -> Leadership:
        with anyio.fail_after(timeout):
            await self.won.wait()
        assert self.lead is not None
        return self.lead

    async def close(self) -> None:
        if self.lead is not None:
            await self.lead.release()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


#: MySQL and PostgreSQL candidates in the contract suite: quick checks, short lease, tokens.
SESSION_LOCK = {"fencing": True, "check_interval": 0.2, "check_timeout": 1.0, "lease": 4}


def owned_server(request: pytest.FixtureRequest, fixture: str) -> Any:
    """The throwaway server behind the DSN fixture; None for an external one (AIOELECT_*), which cannot be faulted."""
    try:
        return request.getfixturevalue(fixture)
    except pytest.skip.Exception:
        return None


def local_case(request: pytest.FixtureRequest) -> BackendCase:
    from aioelect import LocalElector

    def make(name: str, **kw: Any) -> Elector:
        return LocalElector(name=name, **kw)

    return BackendCase("local", make, exclusive=False)


def mysql_case(request: pytest.FixtureRequest) -> BackendCase:
    from aioelect import MySQLElector

    from .harness import MariaDBServer

    dsn: str = request.getfixturevalue("mysql_dsn")
    server: MariaDBServer | None = owned_server(request, "mariadb")

    def make(name: str, *, dsn: str = dsn, **kw: Any) -> Elector:
        return MySQLElector(dsn, name=name, **{**SESSION_LOCK, **kw})

    leftovers = None
    depose = None
    empty_store = None
    if server is not None:
        srv = server

        async def leftovers_() -> int:
            return len(srv.connection_ids())

        async def depose_(elector: Elector) -> None:
            holder = srv.query("SELECT IS_USED_LOCK(%s)", (elector.name,), database="")[0][0]
            assert holder is not None, "nobody holds the lock"
            srv.query(f"KILL {int(holder)}", database="")

        leftovers, depose = leftovers_, depose_
        empty_store = database_store(dsn, lambda sql: srv.query(sql, database=""), make)
    return BackendCase("mysql", make, leftovers=leftovers, depose=depose, empty_store=empty_store)


def etcd_case(request: pytest.FixtureRequest) -> BackendCase:
    import json

    import anyio

    from aioelect import EtcdElector

    from .harness import EtcdServer

    endpoints: list[str] = request.getfixturevalue("etcd_endpoints")
    server: EtcdServer | None = owned_server(request, "etcd")

    def make(name: str, **kw: Any) -> Elector:
        kw.setdefault("ttl", 3)
        return EtcdElector(endpoints, name="/" + name, **kw)

    leftovers = None
    depose = None
    if server is not None:
        srv = server

        async def leftovers_() -> int:
            out = await anyio.to_thread.run_sync(lambda: srv.etcdctl("lease", "list", check=True).stdout)
            return len(out.splitlines()) - 1  # "found N leases", then one per line

        async def depose_(elector: Elector) -> None:
            def revoke() -> None:
                prefix = elector.name + "/"
                listing = srv.etcdctl("get", "--prefix", prefix, "--sort-by=create", "-w", "json", check=True)
                kvs = json.loads(listing.stdout).get("kvs", [])
                assert kvs, "nobody leads"
                srv.etcdctl("lease", "revoke", f"{int(kvs[0]['lease']):x}", check=True)

            await anyio.to_thread.run_sync(revoke)

        leftovers, depose = leftovers_, depose_

    @contextlib.asynccontextmanager
    async def empty_store() -> AsyncIterator[Callable[..., Elector]]:
        yield make  # a new name is a prefix nothing has used

    return BackendCase("etcd", make, leftovers=leftovers, depose=depose, empty_store=empty_store)


def postgres_case(request: pytest.FixtureRequest) -> BackendCase:
    from aioelect import PostgresElector
    from aioelect.backends.sql.postgres import advisory_key, lock_ids

    from .harness import PostgresServer

    dsn: str = request.getfixturevalue("postgres_dsn")
    server: PostgresServer | None = owned_server(request, "postgres")

    def make(name: str, *, dsn: str = dsn, **kw: Any) -> Elector:
        return PostgresElector(dsn, name=name, **{**SESSION_LOCK, "poll_interval": 0.5, **kw})

    leftovers = None
    depose = None
    empty_store = None
    if server is not None:
        srv = server

        async def leftovers_() -> int:
            rows = srv.query(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
            return int(rows[0][0])

        async def depose_(elector: Elector) -> None:
            classid, objid = lock_ids(advisory_key(elector.name))
            rows = srv.query(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid = $1 AND objid = $2 AND objsubid = 1 AND granted",
                (classid, objid),
            )
            assert rows, "nobody holds the lock"

        leftovers, depose = leftovers_, depose_
        # FORCE: a session the server has not finished ending must not fail the DROP.
        empty_store = database_store(
            dsn, lambda sql: srv.query(sql + (" WITH (FORCE)" if sql.startswith("DROP") else "")), make
        )
    return BackendCase("postgres", make, leftovers=leftovers, depose=depose, empty_store=empty_store)


#: Redis candidates in the contract suite: quick renews, short lease.
REDIS = {"check_interval": 0.2, "check_timeout": 1.0, "lease": 4}


def redis_case(request: pytest.FixtureRequest) -> BackendCase:
    from aioelect import RedisElector

    from .harness import RedisServer

    url: str = request.getfixturevalue("redis_url")
    server: RedisServer | None = owned_server(request, "redis_server")

    def make(name: str, **kw: Any) -> Elector:
        return RedisElector(url, name=name, **{**REDIS, **kw})

    leftovers = None
    depose = None
    if server is not None:
        srv = server

        async def leftovers_() -> int:
            """Connections (but the one asking) and lock keys."""

            def count() -> int:
                clients = len(str(srv.command("CLIENT", "LIST")).splitlines()) - 1
                return clients + len(srv.command("KEYS", "*:lock"))

            return await anyio.to_thread.run_sync(count)

        async def depose_(elector: Elector) -> None:
            key = f"aioelect:{{{elector.name}}}:lock"
            deleted = await anyio.to_thread.run_sync(lambda: srv.command("DEL", key))
            assert deleted == 1, "nobody holds the lock"

        leftovers, depose = leftovers_, depose_

    @contextlib.asynccontextmanager
    async def empty_store() -> AsyncIterator[Callable[..., Elector]]:
        prefix = f"aioelect-empty-{secrets.token_hex(4)}:"
        yield lambda name, **kw: make(name, key_prefix=prefix, **kw)

    return BackendCase("redis", make, leftovers=leftovers, depose=depose, empty_store=empty_store)


def file_case(request: pytest.FixtureRequest) -> BackendCase:
    from aioelect import FileElector

    directory: Path = request.getfixturevalue("tmp_path")

    def lock_file(name: str, directory: Path = directory) -> Path:
        return directory / (name.replace("/", "%2F") + ".lock")

    def make(name: str, *, directory: Path = directory, **kw: Any) -> Elector:
        kw.setdefault("check_interval", 0.2)
        return FileElector(lock_file(name, directory), name=name, **kw)

    async def leftovers_() -> int:
        """Descriptors of this process still open on the test's lock files."""
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/self/fd/{fd}").startswith(f"{directory}{os.sep}")
        return count

    async def depose_(elector: Elector) -> None:
        lock_file(elector.name).unlink()  # the leader notices within check_interval

    @contextlib.asynccontextmanager
    async def empty_store() -> AsyncIterator[Callable[..., Elector]]:
        fresh = directory / f"empty-{secrets.token_hex(4)}"
        fresh.mkdir()
        yield lambda name, **kw: make(name, directory=fresh, **kw)

    return BackendCase("file", make, leftovers=leftovers_, depose=depose_, empty_store=empty_store)


def memory_case(request: pytest.FixtureRequest) -> BackendCase:
    from aioelect.testing import MemoryElector

    made: list[MemoryElector] = []

    def make(name: str, **kw: Any) -> Elector:
        elector = MemoryElector(name=name, **kw)
        made.append(elector)
        return elector

    async def leftovers_() -> int:
        """Leaderships held and campaigns waiting in the elections of this test."""
        elections = {elector.name: elector.election for elector in made}
        return sum((e.holder is not None) + e.waiting for e in elections.values())

    async def depose_(elector: Elector) -> None:
        assert isinstance(elector, MemoryElector)
        elector.depose()

    @contextlib.asynccontextmanager
    async def empty_store() -> AsyncIterator[Callable[..., Elector]]:
        yield make  # a new name is an election nothing has used

    return BackendCase("memory", make, leftovers=leftovers_, depose=depose_, empty_store=empty_store)


def on_own_session(
    session_class: Any, elector_class: Any, dsn: str, base: dict[str, Any], opened: list[Any]
) -> Callable[..., Elector]:
    """A ``make`` whose every candidate campaigns on a shared session of its own, closed with it.

    The session takes the candidate's identity and options; it is used
    without ``async with`` (its connection opens at the first campaign), so
    that candidates are built as the contract suite builds them.
    """

    def make(
        name: str, *, dsn: str = dsn, identity: str | None = None, stop_timeout: float = 5.0, **kw: Any
    ) -> Elector:
        session = session_class(dsn, identity=identity, **{**base, **kw})
        session._entered = True  # entered on the candidate's first campaign instead
        opened.append(session)
        elector = elector_class(session=session, name=name, stop_timeout=stop_timeout)
        close = elector.aclose

        async def aclose() -> None:
            await close()
            await session.aclose()

        elector.aclose = aclose  # type: ignore[method-assign]
        return elector

    return make


def shared_case(kind: str, request: pytest.FixtureRequest) -> BackendCase:
    """The ``kind`` case (mysql, postgres) with each candidate on a shared session (MySQLSession, PostgresSession)."""
    from aioelect import MySQLElector, MySQLSession, PostgresElector, PostgresSession

    plain = CASES[kind](request)
    sessions: list[Any] = []
    base = {**SESSION_LOCK, "poll_interval": 0.5}
    if kind == "mysql":
        dsn: str = request.getfixturevalue("mysql_dsn")
        make = on_own_session(MySQLSession, MySQLElector, dsn, base, sessions)
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        make = on_own_session(PostgresSession, PostgresElector, dsn, base, sessions)
    leftovers = None
    if plain.leftovers is not None:
        count = plain.leftovers

        async def leftovers_() -> int:
            # A session keeps its one connection while open (that is its point): only the rest is left over.
            return await count() - sum(s._conn is not None and not s._conn.broken for s in sessions)

        leftovers = leftovers_
    empty_store = None
    if plain.empty_store is not None:
        server = owned_server(request, "mariadb" if kind == "mysql" else "postgres")
        if kind == "mysql":
            query: Callable[[str], object] = lambda sql: server.query(sql, database="")  # noqa: E731
        else:
            query = lambda sql: server.query(sql + (" WITH (FORCE)" if sql.startswith("DROP") else ""))  # noqa: E731
        empty_store = database_store(dsn, query, make)
    # A waiter on a shared session asks once per poll_interval (0.5 s) unless a release is announced to it.
    return BackendCase(
        f"{kind}-shared",
        make,
        leftovers=leftovers,
        depose=plain.depose,
        takeover_bound=2.0,
        empty_store=empty_store,
    )


#: What each backend can do, known before any server starts: "exclusive"
#: (candidates exclude each other), "depose" (leadership can be taken away from
#: outside), "leftovers" (server-side resources can be counted), "empty_store"
#: (candidates can be pointed at a store nothing has used yet).
CAPABILITIES: dict[str, frozenset[str]] = {
    "local": frozenset(),
    "mysql": frozenset({"exclusive", "depose", "leftovers", "empty_store"}),
    "etcd": frozenset({"exclusive", "depose", "leftovers", "empty_store"}),
    "postgres": frozenset({"exclusive", "depose", "leftovers", "empty_store"}),
    "redis": frozenset({"exclusive", "depose", "leftovers", "empty_store"}),
    "mysql-shared": frozenset({"exclusive", "depose", "leftovers", "empty_store"}),
    "postgres-shared": frozenset({"exclusive", "depose", "leftovers", "empty_store"}),
    "file": frozenset({"exclusive", "depose", "leftovers", "empty_store"}),
    "memory": frozenset({"exclusive", "depose", "leftovers", "empty_store"}),
}

CASES: dict[str, Callable[[pytest.FixtureRequest], BackendCase]] = {
    "local": local_case,
    "mysql": mysql_case,
    "etcd": etcd_case,
    "postgres": postgres_case,
    "redis": redis_case,
    "mysql-shared": lambda request: shared_case("mysql", request),
    "postgres-shared": lambda request: shared_case("postgres", request),
    "file": file_case,
    "memory": memory_case,
}
