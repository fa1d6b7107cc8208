"""aioelect: asyncio-native leader election on MySQL/MariaDB, etcd, PostgreSQL, Redis, a lock file, or locally.

Backends whose driver is not installed are importable lazily: their names
resolve on first use and raise ImportError naming the extra to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._api import leadership
from ._elector import Elector, Leadership, current_leadership
from ._electors import LocalElector
from ._errors import (
    BackendUnavailable,
    ElectionError,
    ElectorClosed,
    LeadershipLost,
    LossKind,
    PermanentBackendError,
    UsageError,
)
from ._events import Event
from ._factory import from_env, new
from ._fence import fenced
from ._fenced import FencedStore
from ._main import run
from ._requests import request_step_down, serve_step_downs
from ._shards import Shards

if TYPE_CHECKING:
    from ._electors import EtcdElector, FileElector, MySQLElector, PostgresElector, RedisElector
    from .backends.etcd import EtcdSession
    from .backends.mysql import MySQLSession
    from .backends.postgres import PostgresSession

__all__ = [
    "BackendUnavailable",
    "ElectionError",
    "Elector",
    "ElectorClosed",
    "EtcdElector",
    "EtcdSession",
    "Event",
    "FencedStore",
    "FileElector",
    "Leadership",
    "LeadershipLost",
    "LocalElector",
    "LossKind",
    "MySQLElector",
    "MySQLSession",
    "PermanentBackendError",
    "PostgresElector",
    "PostgresSession",
    "RedisElector",
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

#: The electors that resolve on first use, and the backend module (with its driver) each one needs.
_LAZY = {
    "EtcdElector": "aioelect.backends.etcd",
    "EtcdSession": "aioelect.backends.etcd",
    "FileElector": "aioelect.backends.file",
    "MySQLElector": "aioelect.backends.mysql",
    "MySQLSession": "aioelect.backends.mysql",
    "PostgresElector": "aioelect.backends.postgres",
    "PostgresSession": "aioelect.backends.postgres",
    "RedisElector": "aioelect.backends.redis",
}


def __getattr__(name: str) -> Any:
    backend = _LAZY.get(name)
    if backend is None:
        raise AttributeError(f"module 'aioelect' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(backend)  # ImportError naming the extra when the driver is missing
    from . import _electors

    return getattr(_electors, name, None) or getattr(module, name)
