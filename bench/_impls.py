"""The implementations compared, and what the driver must know about each."""

from __future__ import annotations

import importlib
import shutil
from dataclasses import dataclass

__all__ = ["IMPLS", "Impl"]


@dataclass(frozen=True)
class Impl:
    """One implementation: its candidate script and how to measure it."""

    key: str
    label: str
    backend: str  # "mysql" | "etcd" | "postgres" | "redis" | "file"
    module: str  # bench/candidates/<module>.py
    ours: bool
    #: Modules that must import (``module:name``: and have ``name``), and binaries that must exist.
    requires: tuple[str, ...] = ()
    binaries: tuple[str, ...] = ()
    #: A crash is only noticed when a lease/TTL runs out: crash reps run side by side, not one by one.
    lease_bound_crash: bool = False
    #: Observation windows (s): how long to wait before calling it "never".
    takeover_window: float = 12.0
    deposed_window: float = 8.0
    #: Extra candidate arguments for the frozen-leader scenario (a shorter lease for aioelect).
    frozen_args: tuple[str, ...] = ()
    #: What "frozen" or "deposed" cannot mean for this backend (None: it applies).
    no_deposed: str | None = None
    #: One line on how it is driven, for RESULTS.md.
    how: str = ""
    #: Extra candidate arguments in every scenario (an opt-in of the implementation).
    extra_args: tuple[str, ...] = ()
    #: The only scenarios this row runs (None: every scenario).
    scenarios: tuple[str, ...] | None = None

    def election(self, scenario: str, rep: int | str) -> str:
        """The election/lock name of one repetition (a fresh name each time: nothing carries over)."""
        name = f"bench/{self.key}/{scenario}/{rep}"
        return "/" + name if self.backend == "etcd" else name

    def etcd_prefix(self, name: str) -> str:
        """Where this implementation's keys for election ``name`` live in etcd."""
        if self.module == "tooz_etcd3gw":
            return "/tooz/locks" + name
        if self.module in ("baseline_etcd", "etcdctl_elect"):
            return name + "/"
        return name

    def redis_key(self, name: str) -> str:
        """The key that holds this implementation's lock for election ``name`` in Redis."""
        return {
            "aioelect_redis": f"aioelect:{{{name}}}:lock",
            "python_redis_lock": f"lock:{name}",
            "pottery_redlock": f"redlock:{name}",
        }.get(self.module, name)

    def missing(self) -> str | None:
        """Why this row cannot run here, or None."""
        for need in self.requires:
            module, _, attr = need.partition(":")
            try:
                if not hasattr(importlib.import_module(module), attr or "__name__"):
                    return f"`{module}.{attr}` does not exist"
            except Exception as exc:
                return f"`import {module}` failed: {type(exc).__name__}: {exc}"
        for binary in self.binaries:
            if shutil.which(binary) is None and not shutil.which(binary, path="/usr/sbin:/usr/bin"):
                return f"`{binary}` not found"
        return None


IMPLS: list[Impl] = [
    Impl(
        "aioelect-mysql",
        "aioelect MySQL",
        "mysql",
        "aioelect_mysql",
        True,
        requires=("aioelect.backends.sql.mysql",),
        frozen_args=("--lease", "5"),
        how=(
            "`MySQLElector` defaults (poll 2 s, check 1 s, check timeout 2 s, lease 10 s); lease 5 s when frozen "
            "(check timeout 1.25 s)"
        ),
    ),
    Impl(
        "aioelect-mysql-shared",
        "aioelect MySQL, shared session",
        "mysql",
        "aioelect_sql_shared",
        True,
        requires=("aioelect:MySQLSession",),
        scenarios=("graceful", "handoff", "scale"),
        how="one `MySQLSession` per process (defaults: poll 2 s, check 1 s, lease 10 s), a `MySQLElector(session=...)`"
        " per slot (opt-in: one connection, and the fate of every election of the process, shared; a waiter polls"
        " `GET_LOCK(name, 0)`, so a handover takes up to the 2 s poll)",
    ),
    Impl(
        "baseline-mysql",
        "baseline port, MySQL",
        "mysql",
        "baseline_mysql",
        False,
        requires=("aiomysql",),
        how="literal port: `GET_LOCK(name, 0)` on a new connection every 2 s, never checked again",
    ),
    Impl(
        "tooz-mysql",
        "tooz MySQL lock",
        "mysql",
        "tooz_mysql",
        False,
        requires=("tooz.drivers.mysql",),
        how="`get_lock(name).acquire(blocking=True)`: `GET_LOCK(name, 0)` polled, backoff capped at 1 s",
    ),
    Impl(
        "aioelect-etcd",
        "aioelect etcd",
        "etcd",
        "aioelect_etcd",
        True,
        requires=("aioelect.backends.etcd",),
        lease_bound_crash=True,
        how="`EtcdElector(ttl=5)`",
    ),
    Impl(
        "aioelect-etcd-shared",
        "aioelect etcd, shared session",
        "etcd",
        "aioelect_etcd_shared",
        True,
        requires=("aioelect:EtcdSession",),
        lease_bound_crash=True,
        scenarios=("graceful", "handoff", "coldstart", "scale"),
        how="one `EtcdSession(ttl=5)` per process, an `EtcdElector(session=...)` per slot (opt-in: the lease and"
        " the fate of every election of the process are shared)",
    ),
    Impl(
        "baseline-etcd",
        "baseline port, etcd",
        "etcd",
        "baseline_etcd",
        False,
        requires=("aetcd",),
        lease_bound_crash=True,
        how="literal port of `concurrency` Session(TTL 5) + Election.Campaign on aetcd, never checked again",
    ),
    Impl(
        "tooz-etcd3gw",
        "tooz etcd3gw lock",
        "etcd",
        "tooz_etcd3gw",
        False,
        requires=("tooz.drivers.etcd3gw",),
        lease_bound_crash=True,
        how="etcd3gw lock via etcd's JSON gateway (`/v3/`, which etcd3gw picks from etcd's version), "
        "`lock_timeout=5`, heartbeat thread; polled, backoff capped at 1 s",
    ),
    Impl(
        "aetcd-lock",
        "aetcd Lock",
        "etcd",
        "aetcd_lock",
        False,
        requires=("aetcd",),
        lease_bound_crash=True,
        how="`client.lock(key, ttl=5)`, `refresh()` every TTL/3, stops when a refresh fails",
    ),
    Impl(
        "etcdctl-elect",
        "etcdctl elect (Go)",
        "etcd",
        "etcdctl_elect",
        False,
        binaries=("etcdctl",),
        lease_bound_crash=True,
        takeover_window=75.0,
        deposed_window=26.0,
        how="`etcdctl elect` 3.4, one Go process per candidate; session TTL 60 s (not configurable)",
    ),
    Impl(
        "aioelect-postgres",
        "aioelect PostgreSQL",
        "postgres",
        "aioelect_postgres",
        True,
        requires=("aioelect.backends.sql.postgres",),
        frozen_args=("--lease", "5"),
        how="`PostgresElector` defaults; lease 5 s when frozen (check timeout 1.25 s)",
    ),
    Impl(
        "aioelect-postgres-shared",
        "aioelect PostgreSQL, shared session",
        "postgres",
        "aioelect_sql_shared",
        True,
        requires=("aioelect:PostgresSession",),
        scenarios=("graceful", "handoff", "scale"),
        how="one `PostgresSession` per process (defaults), a `PostgresElector(session=...)` per slot (opt-in: one"
        " connection, and the fate of every election of the process, shared; a release is announced by NOTIFY)",
    ),
    Impl(
        "tooz-postgres",
        "tooz PostgreSQL lock",
        "postgres",
        "tooz_postgres",
        False,
        requires=("tooz.drivers.pgsql",),
        how="`get_lock(name).acquire(blocking=True)`: `pg_advisory_lock` waits in the server",
    ),
    Impl(
        "aioelect-redis",
        "aioelect Redis",
        "redis",
        "aioelect_redis",
        True,
        requires=("aioelect.backends.redis",),
        lease_bound_crash=True,
        scenarios=(
            "rtt",
            "graceful",
            "crash",
            "frozen",
            "deposed",
            "idle",
            "handoff",
            "coldstart",
            "inproc",
            "blocked",
        ),
        how="`RedisElector(lease=5)` (the peers' TTL), other options at their defaults: renew every 0.5 s (a tenth"
        " of the lease; check timeout 1.5 s, renew deadline 3.5 s), a waiter subscribed to the election's channel"
        " and trying again at most every 1 s",
    ),
    Impl(
        "redis-py-lock",
        "redis-py asyncio Lock",
        "redis",
        "redis_py_lock",
        False,
        requires=("redis.asyncio.lock",),
        lease_bound_crash=True,
        how="`client.lock(name, timeout=5)`: `SET NX PX` polled every 0.1 s (its default); `reacquire()` every"
        " TTL/3, stops when one fails",
    ),
    Impl(
        "python-redis-lock",
        "python-redis-lock",
        "redis",
        "python_redis_lock",
        False,
        requires=("redis_lock",),
        lease_bound_crash=True,
        how="`redis_lock.Lock(client, name, expire=5, auto_renewal=True)`: `SET NX EX`, a waiter blocks in `BLPOP`"
        " on the signal list a release pushes to (timeout: the expiry); renewal thread every 2/3 of the expiry,"
        " which ends silently when an extension fails; socket timeout expiry + 5 s (redis-py 8's default 5 s would"
        " cut the `BLPOP` short)",
    ),
    Impl(
        "pottery-redlock",
        "pottery Redlock",
        "redis",
        "pottery_redlock",
        False,
        requires=("pottery:AIORedlock",),
        lease_bound_crash=True,
        how="`AIORedlock(masters={one}, auto_release_time=5, num_extensions=unlimited)`: `SET NX PX` tried with a"
        " random 0-0.2 s sleep between tries; `extend()` every TTL/3, stops when one fails",
    ),
    Impl(
        "redbeat-loop",
        "redbeat-style lock loop",
        "redis",
        "redbeat_loop",
        False,
        requires=("redis.asyncio",),
        lease_bound_crash=True,
        how="celery-redbeat's beat lock, written from its docs: `SET NX PX` (TTL 5 s = 5 ticks) tried every tick"
        " (1 s); each tick extends it by a Lua owner check (`PEXPIRE` while the key holds our token), stops when"
        " one fails",
    ),
    Impl(
        "aioelect-file",
        "aioelect file",
        "file",
        "aioelect_file",
        True,
        requires=("aioelect.backends.file",),
        no_deposed="no server to depose it from",
        how="`FileElector` defaults (`flock`, poll 50 ms)",
    ),
    Impl(
        "tooz-file",
        "tooz file lock",
        "file",
        "tooz_file",
        False,
        requires=("tooz.drivers.file",),
        no_deposed="no server to depose it from",
        how="`get_lock(name).acquire(blocking=True)`: fasteners `fcntl` lock polled every 10-100 ms",
    ),
]
