"""aioelect: asyncio-native leader election on MySQL/MariaDB, etcd, PostgreSQL, Redis, a lock file, or locally.

Backends whose driver is not installed are importable lazily: their names
resolve on first use and raise ImportError naming the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core._errors import (
    BackendUnavailable,
    ElectionError,
    ElectorClosed,
    LeadershipLost,
    LossKind,
    PermanentBackendError,
    UsageError,
)

if TYPE_CHECKING:
    from ._api import leadership
    from ._fence import fenced
    from ._fenced import FencedStore
    from ._main import run
    from ._requests import request_step_down, serve_step_downs
    from ._shards import Shards
    from .backends.etcd import EtcdOptions, EtcdSession
    from .backends.file import FileOptions
    from .backends.local import LocalOptions
    from .backends.redis import RedisOptions
    from .backends.sql.mysql import MySQLOptions, MySQLSession
    from .backends.sql.postgres import PostgresOptions, PostgresSession
    from .core._elector import Elector, Leadership, current_leadership
    from .core._events import Event
    from .wiring._electors import EtcdElector, FileElector, LocalElector, MySQLElector, PostgresElector, RedisElector
    from .wiring._factory import from_env, new

__all__ = [
    "BackendUnavailable",
    "ElectionError",
    "Elector",
    "ElectorClosed",
    "EtcdElector",
    "EtcdOptions",
    "EtcdSession",
    "Event",
    "FencedStore",
    "FileElector",
    "FileOptions",
    "Leadership",
    "LeadershipLost",
    "LocalElector",
    "LocalOptions",
    "LossKind",
    "MySQLElector",
    "MySQLOptions",
    "MySQLSession",
    "PermanentBackendError",
    "PostgresElector",
    "PostgresOptions",
    "PostgresSession",
    "RedisElector",
    "RedisOptions",
    "Shards",
    "UsageError",
    "current_leadership",
    "fenced",
    "from_env",
    "leadership",
    "new",
    "request_step_down",
    "run",
    "serve_step_downs",
]

#: The names imported on first use, and their module: importing ``aioelect`` costs almost nothing, so that
#: ``python -m aioelect`` can take its stop signals before it loads the rest (aioelect.__main__). A backend's
#: electors also need its driver: an ImportError names the extra to install.
_LAZY = {
    "leadership": "aioelect._api",
    "Elector": "aioelect.core._elector",
    "Leadership": "aioelect.core._elector",
    "current_leadership": "aioelect.core._elector",
    "LocalElector": "aioelect.wiring._electors",
    "Event": "aioelect.core._events",
    "from_env": "aioelect.wiring._factory",
    "new": "aioelect.wiring._factory",
    "fenced": "aioelect._fence",
    "FencedStore": "aioelect._fenced",
    "request_step_down": "aioelect._requests",
    "serve_step_downs": "aioelect._requests",
    "run": "aioelect._main",
    "Shards": "aioelect._shards",
    "EtcdElector": "aioelect.backends.etcd",
    "EtcdOptions": "aioelect.backends.etcd",
    "EtcdSession": "aioelect.backends.etcd",
    "FileElector": "aioelect.backends.file",
    "FileOptions": "aioelect.backends.file",
    "LocalOptions": "aioelect.backends.local",
    "MySQLElector": "aioelect.backends.sql.mysql",
    "MySQLSession": "aioelect.backends.sql.mysql",
    "MySQLOptions": "aioelect.backends.sql.mysql",
    "PostgresElector": "aioelect.backends.sql.postgres",
    "PostgresSession": "aioelect.backends.sql.postgres",
    "PostgresOptions": "aioelect.backends.sql.postgres",
    "RedisElector": "aioelect.backends.redis",
    "RedisOptions": "aioelect.backends.redis",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'aioelect' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(where)  # ImportError naming the extra when a backend's driver is missing
    if where.startswith("aioelect.backends."):
        from .wiring import _electors

        value = getattr(_electors, name, None) or getattr(module, name)
    else:
        value = getattr(module, name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
