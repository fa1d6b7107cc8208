"""Real servers for aioelect's own tests and benchmarks: throwaway, on 127.0.0.1, faults on demand.

Nothing here ships in the wheel; users test their code with
:mod:`aioelect.testing` instead. The parts, one job each:

* :mod:`.servers` -- :class:`MariaDBServer`, :class:`EtcdServer`,
  :class:`EtcdCluster`, :class:`PostgresServer`, :class:`RedisServer`,
  :class:`SentinelServer`, all with the lifecycle of
  :mod:`.lifecycle` (start, stop, kill, freeze, thaw, restart, cleanup);
  :class:`RedisCluster`, redis-servers formed into a Redis Cluster.
* :mod:`.proxy` -- :class:`TCPProxy`, a fault-injecting TCP proxy.
* :mod:`.downgrade` -- :class:`DowngradeProxy`, which strips TLS from a MySQL or
  PostgreSQL connection's opening.
* :mod:`.certificates` -- :class:`Certificates`, a throwaway CA for TLS tests.
* :mod:`.clock` -- :class:`~.clock.SkewedClock`, a wall clock stepped and a monotonic
  clock slowed in the processes started on it (an ``LD_PRELOAD`` library built with gcc).
* :mod:`.processes` -- children that die with the test process, bounded waits.
* :mod:`.binaries` -- finding server executables; which etcd runs
  (``AIOELECT_TEST_ETCD_DIR``, ``AIOELECT_TEST_ETCD_VERSION``).
* :mod:`.plugin` -- the pytest fixtures (registered by ``tests/conftest.py``).

Importing it imports only the standard library: ``pymysql`` and ``asyncpg``
load when a MariaDB or PostgreSQL server is made, and pytest with
:mod:`.plugin` alone.
"""

from __future__ import annotations

from .binaries import (
    ENV_ETCD_DIR,
    ENV_ETCD_VERSION,
    etcd_tool_version,
    etcd_version_matches,
    expected_etcd_version,
    require_binary,
)
from .certificates import Certificates
from .downgrade import DowngradeProxy
from .errors import HarnessError, MissingBinaryError, ServerStartError
from .processes import LOOPBACK, free_port
from .proxy import TCPProxy
from .servers.etcd import EtcdCluster, EtcdServer, started_etcd_versions
from .servers.mariadb import MariaDBServer
from .servers.pgbouncer import PgBouncer
from .servers.postgres import PostgresServer
from .servers.redis import RedisCluster, RedisServer, SentinelServer, redis_command

__all__ = [
    "ENV_ETCD_DIR",
    "ENV_ETCD_VERSION",
    "LOOPBACK",
    "Certificates",
    "DowngradeProxy",
    "EtcdCluster",
    "EtcdServer",
    "HarnessError",
    "MariaDBServer",
    "MissingBinaryError",
    "PgBouncer",
    "PostgresServer",
    "RedisCluster",
    "RedisServer",
    "SentinelServer",
    "ServerStartError",
    "TCPProxy",
    "etcd_tool_version",
    "etcd_version_matches",
    "expected_etcd_version",
    "free_port",
    "redis_command",
    "require_binary",
    "started_etcd_versions",
]
