"""The real server each adversary run plays against, and the operator's hand on it.

One class per backend: it starts a throwaway server from ``tests/harness``
(or uses one given), says how electors reach it, builds the exception a
dropped connection raises in that backend's driver, and does the operator's
actions: deleting a candidate's key, revoking a lease (etcd), ending a
session (``KILL`` / ``pg_terminate_backend``), restarting the server (same
port and data; MariaDB and PostgreSQL hand out connection ids and pids
afresh, so old ones are reused). The blocking harness calls run in a worker
thread, so the electors keep running meanwhile.
"""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any, ClassVar

import anyio

from tests.harness import EtcdServer, MariaDBServer, PostgresServer

__all__ = ["SERVERS", "EtcdTarget", "MariaDBTarget", "PostgresTarget", "Target"]


class Target:
    """One backend's server under the adversary."""

    backend: ClassVar[str]
    #: The operator's actions on this server (see :meth:`act`), with their relative weights.
    actions: ClassVar[dict[str, float]]
    #: The exchanges a seed may make slow (see :class:`~.network.Profile`).
    kinds: ClassVar[tuple[str, ...]] = ()
    #: Seconds between the operator's actions, on average (they cost the server little).
    pace: ClassVar[float] = 1.0
    #: The reads by which a waiting candidate learns who leads (see :meth:`~.network.Profile.draw`).
    views: ClassVar[tuple[str, ...]] = ()
    #: Whether a restarted server hands out again the ids of sessions from before, which a session kept across
    #: the restart still carries (see :meth:`~.network.Profile.draw`).
    reuses_ids: ClassVar[bool] = False
    server: MariaDBServer | PostgresServer | EtcdServer

    def __init__(self, name: str) -> None:
        self.name = name
        self.victim_leases = set()
        #: The run's electors (the operator finds a holder's connection among them).
        self.electors: list[Any] = []
        self.victim_share = 0.5

    def start(self) -> None:
        self.server.start()

    def cleanup(self) -> None:
        self.server.cleanup()

    def target(self) -> Any:
        raise NotImplementedError

    def lost(self, what: str) -> Exception:
        """What the driver raises when the connection drops during ``what``."""
        return ConnectionResetError(f"adversary: connection reset during {what or 'a statement'}")

    def cancelled(self) -> Any:
        """The reply by which the server cancels a watch (None: the backend has no watches)."""
        return None

    #: The leases of the seed's victim (etcd): the operator deletes its key more often (``victim_share`` of the
    #: deletions).
    victim_leases: set[str]
    victim_share: float

    async def delete_key_of(self, leases: set[str]) -> str:
        """Delete the candidate key held under one of ``leases`` (etcd); other servers have no such key."""
        return "no candidate keys"

    async def ahead_of(self, leases: set[str]) -> str | None:
        """The lease of the candidate key created just before the one held under ``leases`` (etcd), if any."""
        return None

    async def act(self, action: str, rng: random.Random) -> str:
        """Do ``action`` on the server; say what was done."""
        if action == "restart":
            await anyio.to_thread.run_sync(self.server.restart)
            return "restarted"
        return str(await getattr(self, "_" + action.replace("-", "_"))(rng))

    async def leftovers(self) -> list[str]:
        return []


class EtcdTarget(Target):
    backend = "etcd"
    actions: ClassVar[dict[str, float]] = {"delete-key": 5.0, "revoke-lease": 1.5, "restart": 0.2}
    pace = 0.5
    kinds = ("campaign", "check candidacy", "lease keep-alive", "proclaim", "read key", "read leader", "resign")
    views = ("read leader", "read candidates ahead")

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.server = EtcdServer()

    def target(self) -> Any:
        return self.server.endpoints

    def lost(self, what: str) -> Exception:
        import grpc

        return grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), f"adversary: {what} lost"
        )

    def cancelled(self) -> Any:
        from aetcd import rpc

        return rpc.WatchResponse(canceled=True, cancel_reason="adversary: the server cancelled the watch")

    async def _etcdctl(self, *args: str) -> str:
        server = self.server
        assert isinstance(server, EtcdServer)
        done = await anyio.to_thread.run_sync(lambda: server.etcdctl(*args, check=True))
        return str(done.stdout)

    async def keys(self) -> list[dict[str, Any]]:
        out = await self._etcdctl("get", "--prefix", f"{self.name}/", "-w", "json")
        kvs: list[dict[str, Any]] = json.loads(out).get("kvs", [])
        return sorted(kvs, key=lambda kv: int(kv.get("create_revision", 0)))

    async def _delete_key(self, rng: random.Random) -> str:
        import base64

        keys = await self.keys()
        if not keys:
            return "no key"
        # Often the victim's key; else mostly a waiting candidate's (a leader's is deposed by the revoke as well).
        victims = [kv for kv in keys if base64.b64decode(kv["key"]).decode().rpartition("/")[2] in self.victim_leases]
        pick = keys[1:] if len(keys) > 1 and rng.random() < 0.8 else keys
        if victims and rng.random() < self.victim_share:
            pick = victims
        key = base64.b64decode(rng.choice(pick)["key"]).decode()
        await self._etcdctl("del", key)
        return f"del {key}"

    async def delete_key_of(self, leases: set[str]) -> str:
        """Delete the candidate key of one elector, known by its leases (:attr:`Network.leases`)."""
        import base64

        keys = [base64.b64decode(kv["key"]).decode() for kv in await self.keys()]
        mine = [key for key in keys if key.rpartition("/")[2] in leases]
        if not mine:
            return "no key of its own"
        await self._etcdctl("del", mine[0])
        return f"del {mine[0]}"

    async def ahead_of(self, leases: set[str]) -> str | None:
        import base64

        queue = [base64.b64decode(kv["key"]).decode().rpartition("/")[2] for kv in await self.keys()]
        mine = [i for i, lease in enumerate(queue) if lease in leases]
        return queue[mine[0] - 1] if mine and mine[0] > 0 else None

    async def _revoke_lease(self, rng: random.Random) -> str:
        keys = await self.keys()
        if not keys:
            return "no lease"
        lease = int(rng.choice(keys).get("lease", 0))
        try:
            await self._etcdctl("lease", "revoke", f"{lease:x}")
        except subprocess.CalledProcessError as exc:
            if "lease not found" not in str(exc.stderr):
                raise
            return f"lease {lease:x} already gone"  # its session ended between the read and the revoke
        return f"lease revoke {lease:x}"

    async def leftovers(self) -> list[str]:
        keys = await self.keys()
        return [f"{len(keys)} key(s) left under {self.name}/"] if keys else []


class MariaDBTarget(Target):
    backend = "mysql"
    # Restarts often: each starts connection ids afresh, so the ids of sessions kept across one are reused soon.
    actions: ClassVar[dict[str, float]] = {"kill-holder": 3.0, "kill-session": 2.0, "restart": 3.0}
    pace = 1.2
    reuses_ids = True

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.server = MariaDBServer()

    def target(self) -> Any:
        return self.server.dsn

    async def _query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        server = self.server
        assert isinstance(server, MariaDBServer)
        return await anyio.to_thread.run_sync(lambda: server.query(sql, args or None, database=""))

    async def _kill(self, session: int) -> None:
        try:
            await self._query(f"KILL {int(session)}")
        except Exception as exc:
            if "Unknown thread id" not in str(exc):
                raise

    async def _kill_holder(self, rng: random.Random) -> str:
        rows = await self._query("SELECT IS_USED_LOCK(%s)", self.name)
        holder = rows[0][0] if rows else None
        if holder is None:
            return "no holder"
        await self._kill(int(holder))
        return f"KILL {int(holder)} (the holder)"

    async def _kill_session(self, rng: random.Random) -> str:
        rows = await self._query(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND COMMAND <> 'Daemon' "
            "AND USER <> 'system user' AND ID <> COALESCE(IS_USED_LOCK(%s), 0)",
            self.name,
        )
        if not rows:
            return "no session"
        session = int(rng.choice(rows)[0])
        await self._kill(session)
        return f"KILL {session}"

    async def leftovers(self) -> list[str]:
        rows = await self._query(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND COMMAND <> 'Daemon' "
            "AND USER <> 'system user'"
        )
        return [f"{len(rows)} connection(s) left on MariaDB"] if rows else []


class PostgresTarget(Target):
    backend = "postgres"
    actions: ClassVar[dict[str, float]] = {"kill-holder": 3.0, "kill-session": 2.0, "restart": 1.0}
    pace = 1.5

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.server = PostgresServer()

    def target(self) -> Any:
        return self.server.dsn

    async def _query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        server = self.server
        assert isinstance(server, PostgresServer)
        return await anyio.to_thread.run_sync(lambda: server.query(sql, args))

    async def _kill_holder(self, rng: random.Random) -> str:
        rows = await self._query(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        )
        return f"pg_terminate_backend {[r[0] for r in rows]} (the holder)" if rows else "no holder"

    async def _kill_session(self, rng: random.Random) -> str:
        rows = await self._query(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
            "AND pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)"
        )
        if not rows:
            return "no session"
        pid = int(rng.choice(rows)[0])
        await self._query("SELECT pg_terminate_backend($1)", pid)
        return f"pg_terminate_backend {pid}"

    async def leftovers(self) -> list[str]:
        rows = await self._query(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return [f"{len(rows)} connection(s) left on PostgreSQL"] if rows else []


SERVERS: dict[str, type[Target]] = {"etcd": EtcdTarget, "mysql": MariaDBTarget, "postgres": PostgresTarget}
