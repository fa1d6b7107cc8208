"""The real server each adversary run plays against, and the operator's hand on it.

One class per backend: it starts a throwaway server from ``tests/harness``
(or uses one given), says how electors reach it, builds the exception a
dropped connection raises in that backend's driver, and does the operator's
actions: deleting a candidate's key, revoking a lease (etcd), ending a
session (``KILL`` / ``pg_terminate_backend``), restarting the server (same
port and data; MariaDB and PostgreSQL hand out connection ids and pids
afresh, so old ones are reused), and on MariaDB restarting it with the
connection ids of kept sessions reused on purpose. The blocking harness
calls run in a worker thread, so the electors keep running meanwhile
(except while a restart reusing ids starts the server: see
:meth:`MariaDBTarget._reuse`).
"""

from __future__ import annotations

import json
import random
import socket
import struct
import subprocess
import time
from typing import Any, ClassVar

import anyio

from tests.harness import EtcdServer, MariaDBServer, PostgresServer

__all__ = ["SERVERS", "EtcdTarget", "MariaDBTarget", "Target"]


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
    #: Elector options beside the backend's (:data:`~.run.OPTIONS`).
    extra_options: ClassVar[dict[str, Any]] = {}
    server: MariaDBServer | PostgresServer | EtcdServer

    def __init__(self, name: str) -> None:
        self.name = name
        self.victim_leases = set()
        #: The run's electors (the operator finds a holder's connection among them).
        self.electors: list[Any] = []
        self.victim_share = 0.5
        #: After a restart: the newest token the server had granted before it went down, read before any elector
        #: could take one from the restarted server (None: not read, or no token yet). The operator takes it.
        self.granted_before: int | None = None

    def start(self) -> None:
        self.server.start()

    def cleanup(self) -> None:
        self.server.cleanup()

    def recover(self) -> None:
        """After an action that failed: the server running again (a failed restart leaves it stopped)."""
        self.server.start()

    @property
    def label(self) -> str:
        """The name of this target in the output (its ``--backend``)."""
        return self.backend

    def draw(self, rng: random.Random) -> Any:
        """A :class:`~.network.Profile` of this target's own for one seed, or None: :meth:`Profile.draw`'s."""
        return None

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

    def newest_token(self) -> int | None:
        """The newest token the server holds for the election (None: none, or a server without tokens). Blocking."""
        return None

    def _restart(self) -> None:
        self.server.restart()
        # At once: an elector taking a token from the restarted server in between makes it a little too new.
        self.granted_before = self.newest_token()

    async def act(self, action: str, rng: random.Random) -> str:
        """Do ``action`` on the server; say what was done."""
        if action == "restart":
            await anyio.to_thread.run_sync(self._restart)
            return "restarted"
        return str(await getattr(self, "_" + action.replace("-", "_"))(rng))

    async def back(self, seconds: float) -> bool:
        """Wait, after a restart, until the electors' sessions are back on the server (``seconds`` here).

        False: the restart did not set up what it meant to, and the electors pausing should not campaign again.
        """
        await anyio.sleep(seconds)
        return True

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


def _kept_session(backend: Any) -> tuple[Any, float] | None:
    """(the connection, the monotonic time it was kept) of the lock session ``backend`` keeps, if any.

    Today's library keeps it on the backend's own sessions (``sessions.kept``,
    with ``conn`` and ``since``); an old one (scripts/adversary-old.sh) on the
    backend itself, as a tuple ``(connection, identity, time kept)``.
    """
    old = getattr(backend, "_spare", None)
    if isinstance(old, tuple):
        return old[0], float(old[2])
    kept = getattr(getattr(backend, "sessions", None), "kept", None)
    if kept is None:
        return None
    return kept.conn, float(kept.since)


class MariaDBTarget(Target):
    backend = "mysql"
    # Restarts often: each starts connection ids afresh, so the ids of sessions kept across one are reused soon;
    # half of them hand the next session the id of a session kept from before on purpose.
    actions: ClassVar[dict[str, float]] = {
        "kill-holder": 3.0,
        "kill-session": 2.0,
        "restart": 1.5,
        "restart-reusing-ids": 1.5,
    }
    pace = 1.2
    reuses_ids = True

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.server = MariaDBServer()
        #: After a restart reusing ids: the ids of the sessions kept across it, and the operator's connection.
        self._reused: tuple[set[int], Any] | None = None
        #: The last restart reusing ids did not happen (no session was kept).
        self._idle = False

    def target(self) -> Any:
        return self.server.dsn

    def newest_token(self) -> int | None:
        try:
            rows = self.server.query("SELECT token FROM aioelect_leaders WHERE name = %s", (self.name,))
        except Exception as exc:
            if "doesn't exist" in str(exc):
                return None  # no election has taken a token yet
            raise
        return int(rows[0][0]) if rows else None

    def kept_ids(self, idle: float = 0.3) -> list[int]:
        """The connection ids of the lock sessions electors keep for their next campaign, idle for ``idle`` s.

        An elector that campaigns again at once takes its kept session back
        within 0.1 s: one idle longer is kept by an elector that pauses.
        """
        ids = []
        for elector in self.electors:
            kept = _kept_session(elector._backend)  # private: the adversary reads the kept session's id
            if kept is not None and time.monotonic() - kept[1] >= idle:
                ids.append(int(kept[0].session_id))
        return sorted(ids)

    def _greeting_id(self) -> int:
        """Open a TCP connection, read the id in the server's greeting, close: the server used up one id."""
        server = self.server
        with socket.create_connection((server.host, server.port), timeout=5.0) as sock:
            data = b""
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:3], "little"):
                chunk = sock.recv(512)
                if not chunk:
                    raise ConnectionError("MariaDB closed the connection before its greeting")
                data += chunk
        payload = data[4:]  # protocol 10: its number, the NUL-terminated server version, then the connection id
        end = payload.index(0, 1)
        return int(struct.unpack("<I", payload[end + 1 : end + 5])[0])

    def _reuse(self, kept: list[int], rng: random.Random) -> str:
        """Start the stopped server; use up ids until the next session gets one of ``kept`` (drawn), if one is ahead.

        Blocking, on the electors' event loop on purpose: no elector connects
        until the server's counter stands where a kept id is next.
        """
        import pymysql

        server = self.server
        assert isinstance(server, MariaDBServer)
        server.start()
        self.granted_before = self.newest_token()  # no elector runs meanwhile: this loop is blocked here
        # The operator's own connection first, so that watching for the reused ids later takes none of them.
        conn = pymysql.connect(host=server.host, port=server.port, user="root", autocommit=True)
        self._reused = (set(kept) - {conn.thread_id()}, conn)
        ahead = [i for i in kept if i > conn.thread_id()]
        if not ahead:
            return f"restarted; the kept ids {kept} are handed out again already"
        aim = rng.choice(ahead)
        last = conn.thread_id()
        while last < aim - 1:  # a greeting costs the server an id and leaves no session
            last = self._greeting_id()
        return f"restarted, ids used up to {last}: the next session gets {aim} (kept: {kept})"

    async def _restart_reusing_ids(self, rng: random.Random) -> str:
        """A failover to a server whose id counter stands where a kept session's id is: see :meth:`_reuse`.

        Only while an elector keeps a session (the operator waits up to 1 s
        for one; else nothing is done).
        """
        for _ in range(20):
            if self.kept_ids():
                break
            await anyio.sleep(0.05)
        kept = self.kept_ids()
        if not kept:
            self._idle = True
            return "no kept session"
        await anyio.to_thread.run_sync(self.server.stop)
        return self._reuse(kept, rng)

    async def back(self, seconds: float) -> bool:
        """After a restart reusing ids: until a session with a reused id leads; False if none did within 1.5 s.

        Once one holds the lock, a little longer: its elector learns that it leads.
        """
        if self._idle:  # no restart: nobody to campaign again
            self._idle = False
            return False
        if self._reused is None:
            return await super().back(seconds)
        (kept, conn), self._reused = self._reused, None

        def holder() -> int | None:
            with conn.cursor() as cur:
                cur.execute("SELECT IS_USED_LOCK(%s)", (self.name,))
                row = cur.fetchone()
            return None if row is None or row[0] is None else int(row[0])

        try:
            if not kept:
                return await super().back(seconds)
            with anyio.move_on_after(1.5):
                while True:
                    if await anyio.to_thread.run_sync(holder) in kept:
                        await anyio.sleep(0.1)
                        return True
                    await anyio.sleep(0.02)
            return False
        finally:
            conn.close()

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


#: The targets by ``--backend``; PostgreSQL's, Redis's and the split targets are added by the package, from modules
#: of their own.
SERVERS: dict[str, type[Target]] = {"etcd": EtcdTarget, "mysql": MariaDBTarget}
