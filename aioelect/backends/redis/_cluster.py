"""Redis Cluster: every connection goes to the master that owns the election's slot, found when it connects.

The lock key, the token key and the channel share the hash tag ``{name}``, so
one slot, hence one master, holds both keys: the scripts run there whole,
``WAIT`` counts that master's replicas, and the durability checks
(``CONFIG GET``, ``INFO``) read that master's settings. Each new connection
asks the cluster (the URL's nodes, in turn) which master owns the slot now;
a reply ``MOVED`` or ``ASK`` (the slot moved, a failover) is transient, and
the retry's new connection asks again. Releases are published with
``PUBLISH``, which a cluster forwards to every node, so a subscription on the
slot's master hears them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis import exceptions as rexc
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection

from ..._errors import PermanentBackendError

__all__ = ["SlotConnection", "SlotSSLConnection", "slot_owner"]

Resolve = Callable[[], Awaitable[tuple[str, int]]]


async def slot_owner(
    nodes: tuple[tuple[str, int], ...], key: str, options: dict[str, Any], shown: str
) -> tuple[str, int]:
    """(host, port) of the master that owns ``key``'s slot, as the first node of ``nodes`` that answers says.

    PermanentBackendError for a refusal no retry can fix (credentials, ACL, a server without cluster mode);
    anything else (no node answers, the slot has no master) is transient.
    """
    options = {k: v for k, v in options.items() if k not in ("host", "port", "db")}
    cluster = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        require_full_coverage=False,  # another master down must not hide the one that owns our slot
        dynamic_startup_nodes=False,  # the URL's nodes stay the ones asked
        decode_responses=True,
        **options,
    )
    try:
        await cluster.initialize()
        node = cluster.get_node_from_key(key)
        if node is None:
            raise rexc.SlotNotCoveredError(f"no master of the Redis Cluster at {shown} owns the election's slot")
        return str(node.host), int(node.port)
    except rexc.RedisClusterException as exc:
        cause = exc.__cause__
        if isinstance(cause, (rexc.AuthenticationError, rexc.NoPermissionError)):
            raise cause from None
        if "Cluster mode is not enabled" in str(exc):
            raise PermanentBackendError(
                f"Redis at {shown} is not a Redis Cluster (cluster mode is not enabled): use a redis:// URL"
            ) from None
        raise
    finally:
        await cluster.aclose()


class SlotConnection(Connection):
    """A connection to whichever master owns the election's slot when it connects (``resolve`` says which)."""

    def __init__(self, *, resolve: Resolve, **kwargs: Any) -> None:
        self._resolve = resolve
        super().__init__(**kwargs)

    async def connect(self) -> None:
        if not self.is_connected:
            self.host, self.port = await self._resolve()
        await super().connect()  # type: ignore[no-untyped-call]


class SlotSSLConnection(SSLConnection):
    """:class:`SlotConnection` over TLS."""

    def __init__(self, *, resolve: Resolve, **kwargs: Any) -> None:
        self._resolve = resolve
        super().__init__(**kwargs)

    async def connect(self) -> None:
        if not self.is_connected:
            self.host, self.port = await self._resolve()
        await super().connect()  # type: ignore[no-untyped-call]
