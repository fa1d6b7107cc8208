"""The throwaway servers of one run (the tests' harness) and the counters read from them."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from tests.harness import EtcdServer, MariaDBServer, PostgresServer, RedisServer

__all__ = ["Servers", "process_usage"]

_METRIC = re.compile(r"^(grpc_server_msg_received_total|grpc_server_started_total)\{([^}]*)\} ([0-9.e+]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


#: Gauges of etcd's /metrics read by the scale scenario (no labels).
_ETCD_GAUGES = (
    "etcd_debugging_mvcc_watch_stream_total",
    "etcd_debugging_mvcc_watcher_total",
    "etcd_debugging_mvcc_keys_total",
)


class Servers:
    """MariaDB, etcd, PostgreSQL and Redis on 127.0.0.1, started for this run only, plus a lock-file directory.

    ``scale``: the servers of the scale scenario (thousands of connections): MariaDB
    and PostgreSQL accept far more connections, so that the limit met is the client's
    or the server's memory, not a setting left at its default.
    """

    #: max_connections of the servers (normal, scale).
    MARIADB_MAX_CONNECTIONS = (4000, 12000)
    POSTGRES_MAX_CONNECTIONS = (600, 3500)

    def __init__(self, *, scale: bool = False) -> None:
        self.scale = scale
        self.mariadb: MariaDBServer | None = None
        self.etcd: EtcdServer | None = None
        self.postgres: PostgresServer | None = None
        self.redis: RedisServer | None = None
        self.file_dir = Path(tempfile.mkdtemp(prefix="aioelect-bench-files-"))
        self._mysql_admin: Any = None
        self._pg_admin: Any = None
        self._pg_statements = False

    def start(self, backends: set[str]) -> None:
        """Start the servers the chosen backends need (blocking, bounded by the harness)."""
        if "mysql" in backends:
            # The baseline port leaks a connection per poll: leave it room to show it.
            limit = self.MARIADB_MAX_CONNECTIONS[self.scale]
            self.mariadb = MariaDBServer(extra_args=[f"--max-connections={limit}"])
            self.mariadb.start()
        if "etcd" in backends:
            self.etcd = EtcdServer()
            self.etcd.start()
        if "postgres" in backends:
            limit = self.POSTGRES_MAX_CONNECTIONS[self.scale]
            # pg_stat_statements counts each statement when it ends, with no per-session flush delay.
            preload = ["-c", "shared_preload_libraries=pg_stat_statements"] if _has_pg_stat_statements() else []
            self.postgres = PostgresServer(extra_args=["-c", f"max_connections={limit}", *preload])
            self.postgres.start()
        if "redis" in backends:
            # appendfsync always: what aioelect needs to keep fencing tokens across a crash (Redis 7.0 has no
            # WAITAOF); every implementation runs on this one server.
            self.redis = RedisServer(appendfsync="always")
            self.redis.start()

    def url(self, backend: str) -> str:
        """What candidates of ``backend`` get as ``--url``."""
        if backend == "mysql":
            assert self.mariadb is not None
            return self.mariadb.dsn
        if backend == "etcd":
            assert self.etcd is not None
            return self.etcd.endpoint
        if backend == "postgres":
            assert self.postgres is not None
            return self.postgres.dsn
        if backend == "redis":
            assert self.redis is not None
            return self.redis.url
        return str(self.file_dir)

    def server_pid(self, backend: str) -> int | None:
        server = {"mysql": self.mariadb, "etcd": self.etcd, "postgres": self.postgres, "redis": self.redis}.get(backend)
        return server.pid if server is not None else None

    # --- faults -----------------------------------------------------------------------

    def kill_lock_holder(self, name: str) -> int | None:
        """``KILL`` the MariaDB connection that holds ``GET_LOCK(name)``; its id, or None if nobody holds it."""
        assert self.mariadb is not None
        rows = self.mariadb.query("SELECT IS_USED_LOCK(%s)", (name,), database="")
        holder = rows[0][0] if rows else None
        if holder is None:
            return None
        self.mariadb.query(f"KILL {int(holder)}", database="")
        return int(holder)

    def revoke_leader_lease(self, prefix: str) -> int | None:
        """Revoke the lease of the oldest leased key under ``prefix`` (the leader's); its id, or None."""
        assert self.etcd is not None
        import base64

        def b64(raw: bytes) -> str:
            return base64.b64encode(raw).decode()

        start = prefix.encode()
        end = bytearray(start)
        end[-1] += 1
        body = {"key": b64(start), "range_end": b64(bytes(end))}
        data = _post(f"{self.etcd.client_url}/v3/kv/range", body)
        leased = [kv for kv in data.get("kvs", []) if int(kv.get("lease", 0))]
        if not leased:
            return None
        oldest = min(leased, key=lambda kv: int(kv["create_revision"]))
        lease = int(oldest["lease"])
        _post(f"{self.etcd.client_url}/v3/lease/revoke", {"ID": str(lease)})
        return lease

    def terminate_lock_holder_pg(self, client_pid: int) -> int | None:
        """Terminate the PostgreSQL backend of ``client_pid`` that holds a granted advisory lock."""
        assert self.postgres is not None
        ports = _client_ports(client_pid, self.postgres.port)
        if not ports:
            return None
        rows = self.postgres.query(
            "SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND a.client_port = ANY($1::int[])",
            [ports],
        )
        for (pid,) in rows:
            self.postgres.query("SELECT pg_terminate_backend($1)", [pid])
        return int(rows[0][0]) if rows else None

    def delete_redis_key(self, key: str) -> bool:
        """``DEL`` the lock key ``key`` (the leader's key gone, as an operator or an eviction would do)."""
        assert self.redis is not None
        return bool(self.redis.command("DEL", key))

    # --- counters ---------------------------------------------------------------------

    def counters(self, backend: str) -> dict[str, float]:
        """The server's request counters now (cumulative; the caller takes deltas)."""
        if backend == "mysql":
            return self._mysql_counters()
        if backend == "etcd":
            return self._etcd_counters()
        if backend == "postgres":
            return self._pg_counters()
        if backend == "redis":
            return self._redis_counters()
        return {}

    def _redis_counters(self) -> dict[str, float]:
        assert self.redis is not None
        text = str(self.redis.command("INFO", "all"))
        out: dict[str, float] = {}
        for line in text.splitlines():
            name, _, value = line.strip().partition(":")
            if name in ("total_commands_processed", "total_connections_received", "connected_clients"):
                out[name] = float(value)
            elif name.startswith("cmdstat_"):
                # cmdstat_get:calls=3,usec=...: the calls of each command
                calls = value.split(",", 1)[0].partition("=")[2]
                out["cmd:" + name[len("cmdstat_") :]] = float(calls)
        return out

    def _mysql_counters(self) -> dict[str, float]:
        assert self.mariadb is not None
        import pymysql

        if self._mysql_admin is None:
            self._mysql_admin = pymysql.connect(
                host="127.0.0.1", port=self.mariadb.port, user="root", password="", autocommit=True, read_timeout=10
            )
        with self._mysql_admin.cursor() as cur:
            cur.execute(
                "SHOW GLOBAL STATUS WHERE Variable_name IN "
                "('Questions', 'Com_select', 'Connections', 'Threads_connected', 'Com_do')"
            )
            return {str(k): float(v) for k, v in cur.fetchall()}

    def _etcd_counters(self) -> dict[str, float]:
        assert self.etcd is not None
        with urllib.request.urlopen(self.etcd.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            m = _METRIC.match(line)
            if not m:
                continue
            labels = dict(_LABEL.findall(m.group(2)))
            kind = "msgs" if m.group(1) == "grpc_server_msg_received_total" else "calls"
            key = f"{kind}:{labels.get('grpc_method', '?')}"
            values[key] = values.get(key, 0.0) + float(m.group(3))
        return values

    def _pg_counters(self) -> dict[str, float]:
        assert self.postgres is not None
        import psycopg2

        if self._pg_admin is None:
            self._pg_admin = psycopg2.connect(
                host="127.0.0.1", port=self.postgres.port, user="postgres", dbname="postgres"
            )
            self._pg_admin.autocommit = True
            with self._pg_admin.cursor() as cur:
                try:
                    cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                    self._pg_statements = True
                except psycopg2.Error:
                    self._pg_statements = False
        with self._pg_admin.cursor() as cur:
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute("SELECT sum(xact_commit + xact_rollback)::float8, sum(sessions)::float8 FROM pg_stat_database")
            xacts, sessions = cur.fetchone()
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
            (connected,) = cur.fetchone()
            out = {"transactions": float(xacts or 0), "sessions": float(sessions or 0), "connected": float(connected)}
            if self._pg_statements:
                cur.execute("SELECT coalesce(sum(calls), 0)::float8 FROM pg_stat_statements")
                out["statements"] = float(cur.fetchone()[0])
        return out

    def state(self, backend: str) -> dict[str, float]:
        """What the server holds for its clients now (gauges): connections; on etcd also leases and watches."""
        if backend == "mysql":
            return {"connections": self._mysql_counters()["Threads_connected"]}
        if backend == "postgres":
            return {"connections": self._pg_counters()["connected"]}
        if backend == "redis":
            return {"connections": self._redis_counters()["connected_clients"]}
        if backend != "etcd":
            return {}
        assert self.etcd is not None
        with urllib.request.urlopen(self.etcd.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in _ETCD_GAUGES:
                out[name.removeprefix("etcd_debugging_mvcc_")] = float(value)
        out["leases"] = float(len(_post(f"{self.etcd.client_url}/v3/lease/leases", {}).get("leases", [])))
        return out

    @staticmethod
    def own_requests(backend: str) -> dict[str, float]:
        """What one :meth:`counters` call itself adds to the counters (taken out of every delta)."""
        if backend == "mysql":
            return {"Questions": 1.0}
        if backend == "postgres":
            # The three statements of a snapshot and the pg_stat_statements query of the one before.
            return {"transactions": 3.0, "statements": 4.0}
        if backend == "redis":
            # One INFO on a new connection per snapshot.
            return {"total_commands_processed": 1.0, "total_connections_received": 1.0, "cmd:info": 1.0}
        return {}

    # --- description ----------------------------------------------------------------------

    def versions(self) -> dict[str, str]:
        out: dict[str, str] = {}
        with contextlib.suppress(Exception):
            if self.mariadb is not None:
                out["MariaDB"] = str(self.mariadb.query("SELECT VERSION()", database="")[0][0])
        with contextlib.suppress(Exception):
            if self.etcd is not None:
                with urllib.request.urlopen(f"{self.etcd.client_url}/version", timeout=5) as resp:
                    out["etcd"] = json.loads(resp.read().decode()).get("etcdserver", "?")
        with contextlib.suppress(Exception):
            if self.postgres is not None:
                out["PostgreSQL"] = str(self.postgres.query("SHOW server_version")[0][0])
        with contextlib.suppress(Exception):
            if self.redis is not None:
                info = str(self.redis.command("INFO", "server"))
                out["Redis"] = next(
                    line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("redis_version:")
                )
        return out

    def cleanup(self) -> None:
        for conn in (self._mysql_admin, self._pg_admin):
            with contextlib.suppress(Exception):
                if conn is not None:
                    conn.close()
        for server in (self.mariadb, self.etcd, self.postgres, self.redis):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.cleanup()
        shutil.rmtree(self.file_dir, ignore_errors=True)


def _has_pg_stat_statements() -> bool:
    import glob

    return bool(glob.glob("/usr/lib/postgresql/*/lib/pg_stat_statements.so"))


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        data = json.loads(resp.read().decode())
    assert isinstance(data, dict)
    return data


def _client_ports(pid: int, server_port: int) -> list[int]:
    ports: list[int] = []
    with contextlib.suppress(psutil.Error):
        for conn in psutil.Process(pid).net_connections(kind="tcp"):
            if conn.raddr and conn.raddr.port == server_port:
                ports.append(conn.laddr.port)
    return ports


def process_usage(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) and proportional memory (PSS, MiB) of ``pid`` and all its descendants."""
    cpu = 0.0
    mem = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0, 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            cpu += times.user + times.system
            try:
                mem += proc.memory_full_info().pss / 2**20
            except (psutil.Error, AttributeError):
                mem += proc.memory_info().rss / 2**20
    return cpu, mem
