"""Choosing a backend: etcd > MySQL > PostgreSQL > file > local, the first one configured."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ._config import DEFAULT_NAME
from ._elector import Elector
from ._electors import EtcdElector, FileElector, LocalElector, MySQLElector, PostgresElector
from ._settings import Settings

__all__ = ["from_env", "new"]

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
    file: str | None = None,
    name: str | None = None,
    **options: Any,
) -> Elector:
    """Build an elector, choosing the first backend configured.

    The priority: etcd endpoints -> etcd; else a MySQL DSN -> MySQL;
    else a PostgreSQL DSN -> PostgreSQL; else a lock file path -> file; else
    local.

    ``options`` go to the chosen elector's constructor (``identity``,
    ``poll_interval``, ``ttl``...); an option the chosen backend does not
    take raises TypeError.

    The server backends (etcd, MySQL, PostgreSQL) need ``name``: without
    it, ValueError says why. The file and local backends default to
    :data:`~aioelect._config.DEFAULT_NAME` (``aioelect/leader``).
    """
    if etcd:
        return EtcdElector(etcd, name=_required_name(name, "etcd", "etcd cluster"), **options)
    if mysql:
        return MySQLElector(mysql, name=_required_name(name, "mysql", "MySQL server"), **options)
    if postgres:
        return PostgresElector(postgres, name=_required_name(name, "postgres", "PostgreSQL database"), **options)
    if file:
        return FileElector(file, name=name if name is not None else DEFAULT_NAME, **options)
    return LocalElector(name=name if name is not None else DEFAULT_NAME, **options)


def _required_name(name: str | None, kind: str, server: str) -> str:
    if name is None or name == "":
        raise ValueError(_NAME_REQUIRED.format(kind=kind, server=server))
    return name


def from_env(environ: Mapping[str, str] | None = None, **options: Any) -> Elector:
    """Build an elector with :func:`new` from ``AIOELECT_ETCD_ENDPOINTS``
    (comma separated), ``AIOELECT_MYSQL_DSN``, ``AIOELECT_POSTGRES_DSN``,
    ``AIOELECT_FILE`` and ``AIOELECT_NAME`` (empty means unset; required
    with etcd, MySQL and PostgreSQL, see :func:`new`).

    ``AIOELECT_ETCD_DEGRADE_TO_LOCAL`` (``1``/``true``/``yes``/``on`` or
    ``0``/``false``/``no``/``off``; anything else is a ValueError) sets the
    etcd elector's ``degrade_to_local``, off when unset: leading locally
    without mutual exclusion is never chosen by accident.

    ``options`` override the environment.
    """
    settings = Settings.from_environ(os.environ if environ is None else environ)
    chosen: dict[str, Any] = {**settings.targets, "name": settings.name}
    if settings.etcd_degrade_to_local is not None and settings.etcd_endpoints and "degrade_to_local" not in options:
        chosen["degrade_to_local"] = settings.etcd_degrade_to_local
    chosen.update(options)
    return new(**chosen)
