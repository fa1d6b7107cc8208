"""The servers under test: how candidates reach them (one proxy per candidate and server), the faults done
on the server side, and what a run may not leave behind on them.

Candidates reach a server only through their own :class:`~tests.harness.TCPProxy`, so the nemesis can
partition or slow one candidate, or all of them. The nemesis's own queries go straight to the server.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import ClassVar

from tests.harness import EtcdCluster, EtcdServer, MariaDBServer, PostgresServer, RedisServer, TCPProxy

__all__ = [
    "Etcd1Target",
    "Etcd3Target",
    "MariaDBTarget",
    "PostgresTarget",
    "RedisTarget",
    "ShardsEtcdTarget",
    "ShardsPostgresTarget",
    "Target",
    "checked_kinds",
    "make_target",
]


class Target:
    """One backend's server(s). Subclasses implement the server-specific parts."""

    label: ClassVar[str]
    backend: ClassVar[str]
    #: The faults the nemesis may inject on this backend.
    fault_kinds: ClassVar[tuple[str, ...]] = ("kill", "pause", "depose", "partition", "restart", "slow")
    #: The shards workload (``aioelect.Shards`` over :data:`~soak.timing.SHARD_NAMES`), not one election.
    shards: ClassVar[bool] = False

    def __init__(self, name: str) -> None:
        self.name = name

    def start(self) -> None:
        raise NotImplementedError

    def cleanup(self) -> None:
        raise NotImplementedError

    def upstreams(self) -> list[tuple[str, int]]:
        """The (host, port) each candidate gets one proxy to."""
        raise NotImplementedError

    def candidate_target(self, proxies: list[TCPProxy]) -> str:
        """The DSN or endpoints a candidate uses, through ``proxies`` (one per :meth:`upstreams`)."""
        raise NotImplementedError

    def depose(self) -> str:
        """End the leader's hold from the server side; say what was done."""
        raise NotImplementedError

    def restart(self, downtime: float) -> str:
        """Stop the server, wait ``downtime`` s, start it again (same ports, same data)."""
        raise NotImplementedError

    def ensure_running(self) -> None:
        """Start whatever a failed fault left stopped (the heal of last resort)."""
        raise NotImplementedError

    def leftovers(self) -> list[str]:
        """What the candidates left on the server (connections, leases, keys), as sentences; [] if nothing."""
        raise NotImplementedError

    def split(self, kind: str, duration: float) -> str:
        """Split server nodes from each other for ``duration`` s (``kind``: see :mod:`soak.splits`), then heal."""
        raise NotImplementedError(f"{self.label} has no split {kind}")


class _OneServer(Target):
    """A target that is one server process: restarted as a whole."""

    server: MariaDBServer | PostgresServer | EtcdServer | RedisServer

    def start(self) -> None:
        self.server.start()

    def cleanup(self) -> None:
        self.server.cleanup()

    def upstreams(self) -> list[tuple[str, int]]:
        return [(self.server.host, self.server.port)]

    def restart(self, downtime: float) -> str:
        self.server.stop()
        time.sleep(downtime)
        self.server.start()
        return f"down {downtime:.1f}s"

    def ensure_running(self) -> None:
        self.server.start()


class MariaDBTarget(_OneServer):
    label = "mariadb"
    backend = "mysql"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.server: MariaDBServer = MariaDBServer()
        self._password = secrets.token_hex(8)

    def start(self) -> None:
        self.server.start()
        # A user of their own, so that their connections are told from the nemesis's.
        self.server.create_user("soak", self._password)

    def candidate_target(self, proxies: list[TCPProxy]) -> str:
        return f"mysql://soak:{self._password}@{proxies[0].endpoint}/{self.server.database}"

    def depose(self) -> str:
        rows = self.server.query("SELECT IS_USED_LOCK(%s)", (self.name,), database="")
        holder = rows[0][0] if rows else None
        if holder is None:
            return "no holder"
        try:
            self.server.query(f"KILL {int(holder)}", database="")
        except Exception as exc:
            if "Unknown thread id" not in str(exc):
                raise
        return f"KILL {int(holder)}"

    def leftovers(self) -> list[str]:
        ids = self.server.connection_ids("soak")
        return [f"{len(ids)} candidate connection(s) still open on MariaDB: {ids}"] if ids else []


class PostgresTarget(_OneServer):
    label = "postgres"
    backend = "postgres"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.server: PostgresServer = PostgresServer()

    def candidate_target(self, proxies: list[TCPProxy]) -> str:
        return f"postgresql://postgres@{proxies[0].endpoint}/postgres"

    def depose(self) -> str:
        rows = self.server.query(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        )
        return f"pg_terminate_backend {[r[0] for r in rows]}" if rows else "no holder"

    def leftovers(self) -> list[str]:
        rows = self.server.query(
            "SELECT pid, application_name FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return [f"{len(rows)} client connection(s) still open on PostgreSQL: {rows}"] if rows else []


class RedisTarget(_OneServer):
    """One Redis with the append-only file synced on every write (the backend refuses anything less)."""

    label = "redis"
    backend = "redis"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.server: RedisServer = RedisServer()

    @property
    def _lock_key(self) -> str:
        return f"aioelect:{{{self.name}}}:lock"

    def candidate_target(self, proxies: list[TCPProxy]) -> str:
        return f"redis://{proxies[0].endpoint}/0"

    def depose(self) -> str:
        deleted = self.server.command("DEL", self._lock_key)
        return f"DEL {self._lock_key}" if deleted else "no holder"

    def leftovers(self) -> list[str]:
        found = []
        clients = [
            line for line in str(self.server.command("CLIENT", "LIST")).splitlines() if "cmd=client|list" not in line
        ]
        if clients:
            found.append(f"{len(clients)} client connection(s) still open on Redis")
        if self.server.command("EXISTS", self._lock_key):
            found.append(f"the lock key {self._lock_key} is left")
        return found


class _EtcdTarget(Target):
    backend = "etcd"

    def candidate_target(self, proxies: list[TCPProxy]) -> str:
        return ",".join(p.endpoint for p in proxies)

    def _etcdctl(self, *args: str) -> str:
        raise NotImplementedError

    def _keys(self) -> list[dict[str, object]]:
        out = self._etcdctl("get", "--prefix", f"{self.name}/", "-w", "json")
        kvs: list[dict[str, object]] = json.loads(out).get("kvs", [])
        return sorted(kvs, key=lambda kv: int(str(kv.get("create_revision", 0))))

    def depose(self) -> str:
        keys = self._keys()
        if not keys:
            return "no holder"
        lease = int(str(keys[0].get("lease", 0)))
        self._etcdctl("lease", "revoke", f"{lease:x}")
        return f"lease revoke {lease:x}"

    def leftovers(self) -> list[str]:
        found = []
        keys = self._keys()
        if keys:
            found.append(f"{len(keys)} key(s) left under {self.name}/")
        leases = [line for line in self._etcdctl("lease", "list").splitlines()[1:] if line.strip()]
        if leases:
            found.append(f"{len(leases)} lease(s) left: {leases}")
        return found


class Etcd1Target(_EtcdTarget, _OneServer):
    label = "etcd1"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.server: EtcdServer = EtcdServer()

    def _etcdctl(self, *args: str) -> str:
        return self.server.etcdctl(*args, check=True).stdout


class Etcd3Target(_EtcdTarget):
    label = "etcd3"
    fault_kinds = ("kill", "pause", "depose", "partition", "member", "slow")

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.cluster = EtcdCluster(3)

    def _etcdctl(self, *args: str) -> str:
        return self.cluster.etcdctl(*args, check=True).stdout

    def start(self) -> None:
        self.cluster.start()

    def cleanup(self) -> None:
        self.cluster.cleanup()

    def upstreams(self) -> list[tuple[str, int]]:
        return [(m.host, m.port) for m in self.cluster.members]

    def restart(self, downtime: float) -> str:
        raise NotImplementedError("a three-member cluster loses members, not the whole cluster")

    def kill_member(self, index: int, downtime: float) -> str:
        """SIGKILL member ``index`` (a crash), wait ``downtime`` s, start it again (it rejoins with its data)."""
        member = self.cluster.members[index]
        leader = self.cluster.leader(timeout=1.0)
        member.kill()
        time.sleep(downtime)
        self.cluster.start()
        return f"member {index}{' (raft leader)' if leader is member else ''} down {downtime:.1f}s"

    def ensure_running(self) -> None:
        self.cluster.start()


class ShardsEtcdTarget(Etcd1Target):
    """The shards workload on one etcd: ``depose`` revokes the lease of the oldest key under the group, which is
    one candidate's shared lease (every name it owns goes at once); ``join`` starts a fresh candidate."""

    label = "shards-etcd"
    shards = True
    fault_kinds = (*Etcd1Target.fault_kinds, "join")


class ShardsPostgresTarget(PostgresTarget):
    """The shards workload on PostgreSQL: ``depose`` terminates every session holding an advisory lock (each
    candidate's shared session: every name at once); ``join`` starts a fresh candidate."""

    label = "shards-postgres"
    shards = True
    fault_kinds = (*PostgresTarget.fault_kinds, "join")


_TARGETS: dict[str, type[Target]] = {
    "mariadb": MariaDBTarget,
    "postgres": PostgresTarget,
    "redis": RedisTarget,
    "etcd1": Etcd1Target,
    "etcd3": Etcd3Target,
    "shards-etcd": ShardsEtcdTarget,
    "shards-postgres": ShardsPostgresTarget,
}


def _targets() -> dict[str, type[Target]]:
    # The split workload's targets subclass these: imported once this module is.
    from .splits import Etcd3SplitTarget, SentinelSplitTarget

    return {**_TARGETS, "sentinel-split": SentinelSplitTarget, "etcd3-split": Etcd3SplitTarget}


def make_target(label: str, name: str) -> Target:
    return _targets()[label](name)


def checked_kinds(label: str) -> list[str]:
    """The fault kinds as the checker and the report name them (a partition is a drop or a stall)."""
    kinds: list[str] = []
    for kind in _targets()[label].fault_kinds:
        kinds += ["partition-drop", "partition-stall"] if kind == "partition" else [kind]
    return kinds
