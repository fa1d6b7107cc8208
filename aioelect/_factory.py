"""Choosing a backend: etcd > MySQL > PostgreSQL > Redis > file, the first one configured; local only when asked for.

Nothing configured is an error, never a silent local elector: a local
elector leads at once in every process, so instances that each fell back
to it would all lead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ._config import DEFAULT_NAME
from ._elector import Elector
from ._electors import EtcdElector, FileElector, LocalElector, MySQLElector, PostgresElector, RedisElector
from ._settings import (
    BACKEND_VARIABLES,
    ENV_BACKEND,
    ENV_ETCD_ENDPOINTS,
    ENV_FILE,
    ENV_MYSQL_DSN,
    ENV_NAME,
    ENV_POSTGRES_DSN,
    ENV_REDIS_URL,
    Settings,
)

__all__ = ["from_env", "new"]

log = logging.getLogger("aioelect")

_NOTHING_CONFIGURED = (
    "no backend configured: {how}. A local elector is never chosen by default: it offers no mutual exclusion, "
    "so every instance would lead"
)
_LOCAL_WARNING = (
    "local backend chosen: leads at once, WITHOUT mutual exclusion between processes (every instance leads); "
    "for a single instance in development only"
)

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

    ``options`` go to the chosen elector's constructor (``identity``,
    ``poll_interval``, ``ttl``...); an option the chosen backend does not
    take raises TypeError.

    The server backends (etcd, MySQL, PostgreSQL, Redis) need ``name``: without
    it, ValueError says why. The file and local backends default to
    :data:`~aioelect._config.DEFAULT_NAME` (``aioelect/leader``).
    """
    if local not in (True, False):
        raise ValueError(f"local must be True or False, not {local!r}")
    if local:
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
            raise ValueError(f"local=True and {', '.join(others)} given: choose one backend")
        log.warning("%s", _LOCAL_WARNING)
        return LocalElector(name=name if name is not None else DEFAULT_NAME, **options)
    if etcd:
        return EtcdElector(etcd, name=_required_name(name, "etcd", "etcd cluster"), **options)
    if mysql:
        return MySQLElector(mysql, name=_required_name(name, "mysql", "MySQL server"), **options)
    if postgres:
        return PostgresElector(postgres, name=_required_name(name, "postgres", "PostgreSQL database"), **options)
    if redis:
        return RedisElector(redis, name=_required_name(name, "redis", "Redis server"), **options)
    if file:
        return FileElector(file, name=name if name is not None else DEFAULT_NAME, **options)
    raise ValueError(
        _NOTHING_CONFIGURED.format(how="give etcd=, mysql=, postgres=, redis= or file= (or local=True for development)")
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

    ``AIOELECT_BACKEND`` names the backend (``etcd``, ``mysql``, ``postgres``,
    ``redis``, ``file`` or ``local``): that backend's variable is then required and the
    others are ignored. A local elector is built only when asked for:
    ``AIOELECT_BACKEND=local`` or ``local=True`` (logged at WARNING). With nothing configured,
    raises ValueError listing the variables to set: strict is the safe
    default, never a silent local elector that would let every instance lead.

    ``options`` override the environment.
    """
    settings = Settings.from_environ(os.environ if environ is None else environ)
    kind = settings.backend_kind
    targets = settings.targets
    if kind == "local":
        targets = {}
        options = {"local": True, **options}
    elif kind is not None:
        if targets[kind] is None:
            variable = dict(BACKEND_VARIABLES)[kind]
            raise ValueError(f"{ENV_BACKEND}={kind} but {variable} is not set")
        targets = {kind: targets[kind]}
    elif not any(targets.values()) and not any(options.get(k) for k in (*targets, "local")):
        raise ValueError(
            _NOTHING_CONFIGURED.format(
                how=f"set {ENV_ETCD_ENDPOINTS}, {ENV_MYSQL_DSN}, {ENV_POSTGRES_DSN}, {ENV_REDIS_URL} or {ENV_FILE} "
                f"(with {ENV_NAME}: required by etcd, MySQL, PostgreSQL and Redis), or {ENV_BACKEND}=local for one "
                "instance in development"
            )
        )
    chosen: dict[str, Any] = {**targets, "name": settings.name}
    if settings.etcd_degrade_to_local is not None and settings.etcd_endpoints and "degrade_to_local" not in options:
        chosen["degrade_to_local"] = settings.etcd_degrade_to_local
    chosen.update(options)
    return new(**chosen)
