"""The message-level adversary: seeded faults on every exchange between a backend and its server.

Where the nemesis (:mod:`soak.nemesis`) acts on processes and TCP
connections, the adversary sits at the backends' interceptor seam
(:class:`aioelect.core._backend.Interceptor`): it delays each request and each
reply independently, loses some of them, cancels etcd watches as the server
would, and, beside it, an operator deletes keys, revokes leases, ends
sessions and restarts the server. Several electors run in one process
against a real server, so every time is exact. :mod:`soak.checker` judges
the history. See docs/adversary.md.
"""

from .cluster_target import ClusterTarget
from .etcd_cluster_target import EtcdClusterTarget
from .postgres_target import PostgresTarget
from .redis_target import RedisTarget
from .sentinel_target import SentinelTarget
from .servers import SERVERS

SERVERS["postgres"] = PostgresTarget
SERVERS["redis"] = RedisTarget  # beside the others, in modules of their own
SERVERS["redis-sentinel"] = SentinelTarget
SERVERS["etcd-cluster"] = EtcdClusterTarget
SERVERS["redis-cluster"] = ClusterTarget
