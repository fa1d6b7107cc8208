"""Redis Cluster: every connection goes to the master that owns the election's slot, found when it connects.

The lock key, the token key and the channel share the hash tag ``{name}``, so
one slot, hence one master, holds both keys: the scripts run there whole,
``WAIT`` counts that master's replicas, and the durability checks
(``CONFIG GET``, ``INFO``) read that master's settings. Each new connection
asks the cluster (the URL's nodes, in turn) which master owns the slot now;
a reply ``MOVED`` or ``ASK`` (the slot moved, a failover) is transient, and
the retry's new connection asks again. A master that answers ``CLUSTERDOWN``
(cut off from the cluster bus, it may still name itself the slot's owner
while the others have promoted its replica) is asked last from then on.
Releases are published with ``PUBLISH``, which a cluster forwards to every
node, so a subscription on the slot's master hears them.
"""

from __future__ import annotations

from typing import Any

from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, SSLConnection
from redis.crc import key_slot

from ...core._errors import PermanentBackendError
from ._replies import bounded

__all__ = ["SlotConnection", "SlotOwner", "SlotSSLConnection"]


class SlotOwner:
    """Finds the master that owns a key's slot: asks the cluster's nodes in turn (``CLUSTER SLOTS``), the last one
    that answered first.

    :meth:`distrust` sends a node that answered ``CLUSTERDOWN`` to the end of the list: a master cut off from the
    bus still names itself, and asked first it would keep every retry on it however long the cut lasts.

    One request on a short connection per lookup, so a user needs ``+cluster|slots`` and nothing more.
    PermanentBackendError for a refusal no retry can fix (credentials, ACL, a server without cluster mode);
    anything else (no node answers, the slot has no master) is raised as redis-py raised it, transient.
    """

    def __init__(self, nodes: tuple[tuple[str, int], ...], key: str, options: dict[str, Any], shown: str) -> None:
        self.nodes = list(nodes)
        self.slot = key_slot(key.encode())
        self.options = {k: v for k, v in options.items() if k not in ("host", "port", "db")}
        self.shown = shown

    async def __call__(self) -> tuple[str, int]:
        error: BaseException | None = None
        for index, (host, port) in enumerate(list(self.nodes)):
            client = bounded(Redis(host=host, port=port, decode_responses=True, **self.options))
            try:
                ranges = await client.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call, unused-ignore]
            except (rexc.AuthenticationError, rexc.NoPermissionError):
                raise
            except rexc.ResponseError as exc:
                if "cluster support disabled" in str(exc) or "cluster mode" in str(exc).lower():
                    raise PermanentBackendError(
                        f"Redis at {self.shown} is not a Redis Cluster (cluster support disabled): use a redis:// URL"
                    ) from None
                error = exc
                continue
            except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
                error = exc
                continue
            finally:
                await client.aclose()
            if index and (host, port) in self.nodes:  # asked first next time
                self.nodes.remove((host, port))
                self.nodes.insert(0, (host, port))
            for first, last, master, *_ in ranges:
                if int(first) <= self.slot <= int(last):
                    return _address(master, host), int(master[1])
            raise rexc.SlotNotCoveredError(f"slot {self.slot} has no master in the Redis Cluster at {self.shown}")
        assert error is not None
        raise error

    def distrust(self, host: str, port: int) -> None:
        """Ask ``host:port`` last from now on (until it is the only one that answers)."""
        if (host, port) in self.nodes:
            self.nodes.remove((host, port))
            self.nodes.append((host, port))


def _address(master: list[Any], asked: str) -> str:
    """The master's host as ``CLUSTER SLOTS`` gives it; an empty one (a node that does not know its own address)
    is the node asked."""
    return str(master[0]) or asked


class SlotConnection(Connection):
    """A connection to whichever master owns the election's slot when it connects (``resolve`` says which); a
    ``CLUSTERDOWN`` reply makes ``resolve`` ask that master last."""

    def __init__(self, *, resolve: SlotOwner, **kwargs: Any) -> None:
        self._resolve = resolve
        super().__init__(**kwargs)

    async def connect(self) -> None:
        if not self.is_connected:
            self.host, self.port = await self._resolve()
        await super().connect()  # type: ignore[no-untyped-call, unused-ignore]

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except rexc.ResponseError as exc:
            # redis-py 5.0 parses CLUSTERDOWN on a plain connection as a ResponseError, later ones do not.
            if isinstance(exc, rexc.ClusterDownError) or str(exc).startswith("CLUSTERDOWN"):
                self._resolve.distrust(self.host, self.port)
            raise


class SlotSSLConnection(SlotConnection, SSLConnection):
    """:class:`SlotConnection` over TLS (redis-py's :class:`SSLConnection` next in the method order)."""
