"""aioelect: asyncio-native leader election on MySQL/MariaDB, etcd, PostgreSQL, a lock file, or locally.

Backends whose driver is not installed are importable lazily: their names
resolve on first use and raise ImportError naming the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._elector import Elector, Leadership, leadership
from ._errors import BackendUnavailable, ElectionError, LeadershipLost
from ._events import Event
from ._factory import from_env, new
from .backends.local import LocalElector

if TYPE_CHECKING:
    from .backends.etcd import EtcdElector
    from .backends.file import FileElector
    from .backends.mysql import MySQLElector
    from .backends.postgres import PostgresElector

__all__ = [
    "BackendUnavailable",
    "ElectionError",
    "Elector",
    "EtcdElector",
    "Event",
    "FileElector",
    "Leadership",
    "LeadershipLost",
    "LocalElector",
    "MySQLElector",
    "PostgresElector",
    "from_env",
    "leadership",
    "new",
]

_LAZY = {
    "EtcdElector": "aioelect.backends.etcd",
    "FileElector": "aioelect.backends.file",
    "MySQLElector": "aioelect.backends.mysql",
    "PostgresElector": "aioelect.backends.postgres",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'aioelect' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
