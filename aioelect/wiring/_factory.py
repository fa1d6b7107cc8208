"""Choosing a backend: etcd > MySQL > PostgreSQL > Redis > file, the first one configured; local only when asked for.

Nothing configured is an error, never a silent local elector: a local
elector leads at once in every process, so instances that each fell back
to it would all lead.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core._config import DEFAULT_NAME, TIMING_OPTIONS
from ..core._elector import Elector, backend_of
from ._electors import (
    EtcdElector,
    FileElector,
    LocalElector,
    MemoryElector,
    MySQLElector,
    PostgresElector,
    RedisElector,
)
from ._settings import (
    ENV_BACKEND,
    ENV_ETCD_ENDPOINTS,
    ENV_FILE,
    ENV_MYSQL_DSN,
    ENV_NAME,
    ENV_POSTGRES_DSN,
    ENV_PRIORITY,
    ENV_REDIS_URL,
    Settings,
)

__all__ = ["PORTABLE_OPTIONS", "from_env", "new"]

log = logging.getLogger("aioelect")

_NOTHING_CONFIGURED = (
    "no backend configured: {how}. A local elector is never chosen by default: it offers no mutual exclusion, "
    "so every instance would lead"
)
_LOCAL_WARNING = (
    "local backend chosen: leads at once, WITHOUT mutual exclusion between processes (every instance leads); "
    "for a single instance in development only"
)

_MEMORY_WARNING = (
    "memory backend chosen: an election inside this event loop only, WITHOUT mutual exclusion between processes "
    "(every process leads its own); for tests"
)

#: The timing options every backend accepts through :func:`new` and :func:`from_env`: a backend uses those it
#: has and logs each one it has not at WARNING, once per process. ``ttl`` is a synonym of ``lease``.
PORTABLE_OPTIONS = TIMING_OPTIONS

#: The portable options each backend has, and why the others mean nothing to it.
_HAS: dict[str, frozenset[str]] = {
    "etcd": frozenset({"lease", "renew_deadline", "connect_timeout"}),
    "mysql": frozenset(PORTABLE_OPTIONS),
    "postgres": frozenset(PORTABLE_OPTIONS),
    "redis": frozenset(PORTABLE_OPTIONS),
    "file": frozenset({"poll_interval", "check_interval"}),
    "local": frozenset(),
    "memory": frozenset({"renew_deadline", "check_interval"}),
}
_WHY = {
    "etcd": "etcd watches the election instead of polling, and confirms with the lease's keep-alives",
    "file": "the kernel holds the lock for as long as the leader's process lives: no lease, no server",
    "local": "a local elector leads at once and is never taken away",
    "memory": "an in-memory election has no lease, polls nothing and has no server",
}
#: (backend, option) pairs already logged, so that each is said once per process.
_IGNORED_SAID: set[tuple[str, str]] = set()


def _portable(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for the ``kind`` backend: the lease under the word its elector takes (``ttl`` for etcd, else
    ``lease``), in whole seconds where the backend counts them, and each portable option the backend has not
    dropped with a WARNING (once per process)."""
    options = dict(options)
    given: dict[str, Any] = {word: options.pop(word) for word in ("lease", "ttl") if word in options}
    if len(given) == 2 and given["lease"] != given["ttl"]:
        raise ValueError(f"ttl={given['ttl']!r} and lease={given['lease']!r}: ttl is etcd's word for lease, give one")
    if given:
        # The one word the chosen elector takes for the lease (etcd's is its own, ``ttl``).
        options["ttl" if kind == "etcd" else "lease"] = _lease(kind, given)
    for option in PORTABLE_OPTIONS:
        if option in options and option not in _HAS[kind]:
            value = options.pop(option)
            if (kind, option) not in _IGNORED_SAID:
                _IGNORED_SAID.add((kind, option))
                log.warning("%s=%r means nothing to the %s backend, ignored: %s", option, value, kind, _WHY[kind])
    return options


def _lease(kind: str, given: Mapping[str, Any]) -> Any:
    """The lease the ``kind`` backend gets from ``given`` (``lease``, ``ttl`` or both, equal)."""
    if "ttl" in given:
        # etcd's own word keeps etcd's whole seconds, as its elector takes it: never rounded.
        ttl = given["ttl"]
        return int(ttl) if isinstance(ttl, float) and ttl.is_integer() else ttl
    lease = given["lease"]
    if kind in ("etcd", "mysql") and isinstance(lease, float) and math.isfinite(lease) and lease > 0:
        # etcd's TTL and MySQL's wait_timeout are whole seconds: rounded up, never shortened.
        if not lease.is_integer():
            log.warning(
                "lease=%r rounded up to %d s: the %s backend counts whole seconds", lease, math.ceil(lease), kind
            )
        return math.ceil(lease)
    return lease


_NAME_REQUIRED = (
    "the {kind} backend needs an election name: pass name=... (AIOELECT_NAME for from_env() and the "
    "aioelect command's --name). Every client of one {server} shares its lock names, so a default name would make "
    "unrelated services that use the same server elect one leader between them; choose a name specific to "
    "this service, such as 'billing/invoice-cron'"
)


def new(
    *,
    etcd: str | Sequence[str] | None = None,
    mysql: str | None = None,
    postgres: str | None = None,
    redis: str | None = None,
    file: str | None = None,
    local: bool = False,
    memory: bool = False,
    name: str | None = None,
    **options: Any,
) -> Elector:
    """Build an elector, choosing the first backend configured.

    The priority: etcd endpoints -> etcd; else a MySQL DSN -> MySQL;
    else a PostgreSQL DSN -> PostgreSQL; else a Redis URL -> Redis; else a
    lock file path -> file.
    ``local=True`` (and nothing else) builds a :class:`LocalElector`, logged
    at WARNING: it offers no mutual exclusion. With nothing configured, or
    ``local=True`` beside another backend, raises ValueError: strict is the
    safe default, since instances that each fell back to leading locally
    would all lead.

    ``memory=True`` (and nothing else) builds a
    :class:`~aioelect.testing.MemoryElector`, logged at WARNING: an election
    inside one event loop, for tests.

    ``options`` go to the chosen elector's constructor (``identity``,
    ``stop_timeout`` and the backend's own). The timing options are one
    vocabulary for every backend (:data:`PORTABLE_OPTIONS`): ``lease``
    (seconds a silent leader keeps the election: MySQL's ``wait_timeout``,
    PostgreSQL's ``idle_session_timeout``, etcd's lease TTL; ``ttl`` is a
    synonym), ``renew_deadline``, ``poll_interval``, ``check_interval``,
    ``check_timeout`` and ``connect_timeout``. A backend uses those it has
    (etcd and MySQL round ``lease`` up to whole seconds, at WARNING) and
    logs each one it has not at WARNING, once per process, so the same code
    runs on a lock file in development and on a server in production. An
    option no backend takes (a typo) raises TypeError.

    The server backends (etcd, MySQL, PostgreSQL, Redis) need ``name``: without
    it, ValueError says why. The file and local backends default to
    :data:`~aioelect.core._config.DEFAULT_NAME` (``aioelect/leader``).
    """
    for flag, value in (("local", local), ("memory", memory)):
        if value not in (True, False):
            raise ValueError(f"{flag} must be True or False, not {value!r}")
    if local and memory:
        raise ValueError("local=True and memory=True given: choose one backend")
    if local or memory:
        chosen = "local" if local else "memory"
        others = [
            kind
            for kind, given in (
                ("etcd", etcd),
                ("mysql", mysql),
                ("postgres", postgres),
                ("redis", redis),
                ("file", file),
            )
            if given
        ]
        if others:
            raise ValueError(f"{chosen}=True and {', '.join(others)} given: choose one backend")
        log.warning("%s", _LOCAL_WARNING if local else _MEMORY_WARNING)
        host_name = name if name is not None else DEFAULT_NAME
        if local:
            return LocalElector(name=host_name, **_portable("local", options))
        return MemoryElector(name=host_name, **_portable("memory", options))
    if etcd:
        return EtcdElector(etcd, name=_required_name(name, "etcd", "etcd cluster"), **_portable("etcd", options))
    if mysql:
        return MySQLElector(mysql, name=_required_name(name, "mysql", "MySQL server"), **_portable("mysql", options))
    if postgres:
        return PostgresElector(
            postgres, name=_required_name(name, "postgres", "PostgreSQL database"), **_portable("postgres", options)
        )
    if redis:
        return RedisElector(redis, name=_required_name(name, "redis", "Redis server"), **_portable("redis", options))
    if file:
        return FileElector(file, name=name if name is not None else DEFAULT_NAME, **_portable("file", options))
    raise ValueError(
        _NOTHING_CONFIGURED.format(
            how="give etcd=, mysql=, postgres=, redis= or file= (or local=True for development, memory=True for tests)"
        )
    )


def _required_name(name: str | None, kind: str, server: str) -> str:
    if name is None or name == "":
        raise ValueError(_NAME_REQUIRED.format(kind=kind, server=server))
    return name


def from_env(environ: Mapping[str, str] | None = None, **options: Any) -> Elector:
    """Build an elector with :func:`new` from ``AIOELECT_ETCD_ENDPOINTS``
    (comma separated), ``AIOELECT_MYSQL_DSN``, ``AIOELECT_POSTGRES_DSN``,
    ``AIOELECT_REDIS_URL``, ``AIOELECT_FILE`` and ``AIOELECT_NAME`` (empty
    means unset; required with etcd, MySQL, PostgreSQL and Redis, see
    :func:`new`).

    ``AIOELECT_ETCD_DEGRADE_TO_LOCAL`` (``1``/``true``/``yes``/``on`` or
    ``0``/``false``/``no``/``off``; anything else is a ValueError) sets the
    etcd elector's ``degrade_to_local``, off when unset: leading locally
    without mutual exclusion is never chosen by accident.

    ``AIOELECT_LEASE``, ``AIOELECT_RENEW_DEADLINE``, ``AIOELECT_POLL_INTERVAL``,
    ``AIOELECT_CHECK_INTERVAL``, ``AIOELECT_CHECK_TIMEOUT`` and
    ``AIOELECT_CONNECT_TIMEOUT`` (seconds) set the portable timing options
    of :func:`new`, on whichever backend is chosen.

    Each backend's own options have a variable too
    (:data:`~aioelect.wiring._settings.BACKEND_OPTION_VARIABLES`):
    ``AIOELECT_FENCING`` (MySQL, PostgreSQL), ``AIOELECT_ALLOW_UNSAFE_TOPOLOGY``
    (MySQL), ``AIOELECT_ALLOW_VOLATILE_TOKENS`` (MySQL's
    ``allow_volatile_tokens``, Redis's ``volatile_tokens``),
    ``AIOELECT_MIN_REPLICAS`` and ``AIOELECT_KEY_PREFIX`` (Redis),
    ``AIOELECT_SCHEMA`` (PostgreSQL) and ``AIOELECT_FILE_MODE`` (the file
    backend, ``600`` or ``660``). One set for a backend other than the one
    chosen is logged at WARNING (once per process) and ignored.

    ``AIOELECT_BACKEND`` names the backend (``etcd``, ``mysql``, ``postgres``,
    ``redis``, ``file``, ``local`` or ``memory``): that backend's variable is then
    required and the others are ignored. A local elector is built only when
    asked for: ``AIOELECT_BACKEND=local`` or ``local=True`` (logged at
    WARNING); ``AIOELECT_BACKEND=memory`` builds a
    :class:`~aioelect.testing.MemoryElector` (logged at WARNING), so that
    tests of code that calls ``from_env()`` need no server. With nothing configured,
    raises ValueError listing the variables to set: strict is the safe
    default, never a silent local elector that would let every instance lead.

    ``AIOELECT_PRIORITY`` (a whole number; ``priority=`` overrides it)
    gives the elector a priority (:meth:`~aioelect.Elector.set_priority`).

    ``options`` override the environment.
    """
    priority = options.pop("priority", None)
    if priority is None:
        priority = priority_from((os.environ if environ is None else environ).get(ENV_PRIORITY))
    elector = new(**env_options(environ, options))
    if priority is not None:
        elector.set_priority(priority)
    return elector


def priority_from(text: str | None) -> int | None:
    """The priority ``AIOELECT_PRIORITY`` holds (None: unset or empty); ValueError naming it if not a whole number."""
    if text is None or not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{ENV_PRIORITY} must be a whole number, not {text[:40]!r}") from None


def env_options(environ: Mapping[str, str] | None, options: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments :func:`from_env` gives :func:`new`: the environment's, ``options`` over them."""
    settings = Settings.from_environ(os.environ if environ is None else environ)
    kind = settings.backend_kind
    targets = settings.targets
    if kind in ("local", "memory"):
        targets = {}
        options = {kind: True, **options}
    elif kind is not None:
        settings.backend()  # ValueError when the variable of the backend named is not set
        targets = {kind: targets[kind]}
    elif not any(targets.values()) and not any(options.get(k) for k in (*targets, "local", "memory")):
        raise ValueError(
            _NOTHING_CONFIGURED.format(
                how=f"set {ENV_ETCD_ENDPOINTS}, {ENV_MYSQL_DSN}, {ENV_POSTGRES_DSN}, {ENV_REDIS_URL} or {ENV_FILE} "
                f"(with {ENV_NAME}: required by etcd, MySQL, PostgreSQL and Redis), or {ENV_BACKEND}=local for one "
                "instance in development"
            )
        )
    chosen: dict[str, Any] = {**targets, "name": settings.name, **settings.timing}
    if settings.etcd_degrade_to_local is not None and settings.etcd_endpoints and "degrade_to_local" not in options:
        chosen["degrade_to_local"] = settings.etcd_degrade_to_local
    chosen.update(options)
    backend = next((k for k in _TARGETS if chosen.get(k)), None)
    if backend is not None and settings.backend_variables:
        own, ignored = settings.backend_options(backend)
        for option, value in own.items():
            chosen.setdefault(option, value)
        for variable in ignored:
            if (backend, variable) not in _IGNORED_SAID:
                _IGNORED_SAID.add((backend, variable))
                log.warning("%s is set but means nothing to the %s backend: ignored", variable, backend)
    return chosen


_TARGETS = ("etcd", "mysql", "postgres", "redis", "file", "local", "memory")


def shared_sql_session(chosen: Mapping[str, Any], identity: str) -> tuple[Any, Callable[[str], Elector]] | None:
    """For :func:`new`'s arguments ``chosen``: when they choose MySQL or PostgreSQL, a shared session (not entered)
    with their options and ``identity``, and a function building an elector on it per election name; else None.

    ValueError or TypeError for options the session refuses, as :func:`new` raises them.
    """
    if any(chosen.get(k) for k in ("etcd", "local", "memory")):
        return None
    kind = "mysql" if chosen.get("mysql") else "postgres" if chosen.get("postgres") else None
    if kind is None:
        return None
    stop_timeout = chosen.get("stop_timeout", 5.0)
    rest = {k: v for k, v in chosen.items() if k not in (*_TARGETS, "name", "identity", "stop_timeout")}
    if kind == "mysql":
        from ..backends.sql.mysql import MySQLSession

        mysql = MySQLSession(chosen["mysql"], identity=identity, **_portable("mysql", rest))
        return mysql, lambda name: MySQLElector(session=mysql, name=name, stop_timeout=stop_timeout)
    from ..backends.sql.postgres import PostgresSession

    postgres = PostgresSession(chosen["postgres"], identity=identity, **_portable("postgres", rest))
    return postgres, lambda name: PostgresElector(session=postgres, name=name, stop_timeout=stop_timeout)


def shared_session_of(elector: Elector) -> tuple[str, bool] | None:
    """The identity of the shared MySQL or PostgreSQL session ``elector`` is on, and whether the server reports
    the session's identity (not the elector's) as the leader of every election on it; None on no such session."""
    backend = backend_of(elector)
    identity = getattr(getattr(backend, "sessions", None), "identity", None)  # a shared session's; own ones have none
    if not isinstance(identity, str):
        return None
    return identity, not getattr(backend, "records_identity", False)
