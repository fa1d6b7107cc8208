"""Choosing a backend: the original factory's priority, etcd > MySQL > local."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ._elector import Elector

__all__ = ["from_env", "new"]

DEFAULT_NAME = "aioelect/leader"


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

    The original priority: etcd endpoints -> etcd; else a MySQL DSN -> MySQL;
    else a PostgreSQL DSN -> PostgreSQL; else a lock file path -> file; else
    local.

    ``options`` go to the chosen elector's constructor (``identity``,
    ``poll_interval``, ``ttl``...); an option the chosen backend does not
    take raises TypeError.
    """
    if etcd:
        from .backends.etcd import EtcdElector

        return EtcdElector(etcd, name=name if name is not None else "/" + DEFAULT_NAME, **options)
    if mysql:
        from .backends.mysql import MySQLElector

        return MySQLElector(mysql, name=name if name is not None else DEFAULT_NAME, **options)
    if postgres:
        from .backends.postgres import PostgresElector

        return PostgresElector(postgres, name=name if name is not None else DEFAULT_NAME, **options)
    if file:
        from .backends.file import FileElector

        return FileElector(file, name=name if name is not None else DEFAULT_NAME, **options)
    from .backends.local import LocalElector

    return LocalElector(name=name if name is not None else DEFAULT_NAME, **options)


def from_env(environ: Mapping[str, str] | None = None, **options: Any) -> Elector:
    """Build an elector with :func:`new` from ``AIOELECT_ETCD_ENDPOINTS``
    (comma separated), ``AIOELECT_MYSQL_DSN``, ``AIOELECT_POSTGRES_DSN``,
    ``AIOELECT_FILE`` and ``AIOELECT_NAME`` (empty means unset).

    ``options`` override the environment.
    """
    env = os.environ if environ is None else environ
    settings: dict[str, Any] = {
        "etcd": env.get("AIOELECT_ETCD_ENDPOINTS") or None,
        "mysql": env.get("AIOELECT_MYSQL_DSN") or None,
        "postgres": env.get("AIOELECT_POSTGRES_DSN") or None,
        "file": env.get("AIOELECT_FILE") or None,
        "name": env.get("AIOELECT_NAME") or None,
    }
    settings.update(options)
    return new(**settings)
