"""A throwaway MariaDB server (``mariadbd`` with a temporary data directory).

``pymysql`` is imported only when a server is queried.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Sequence
from typing import Any

from ..binaries import require_binary, require_module
from ..lifecycle import OnePortServer
from ..processes import LOOPBACK, run_bounded

__all__ = ["MariaDBServer"]


def _quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class MariaDBServer(OnePortServer):
    """A throwaway MariaDB server on 127.0.0.1 with its own data directory.

    ``root`` has an empty password; the database ``database`` (default
    ``aioelect_test``) exists after every start.  Commits are durable
    (``innodb_flush_log_at_trx_commit=1``, no binary log), as fencing tokens
    asked for by name require; the doublewrite buffer is off for speed.
    """

    kind = "mariadb"

    def __init__(
        self,
        *,
        port: int | None = None,
        database: str = "aioelect_test",
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        require_module("pymysql", "MariaDBServer")  # start() and query() use it
        self._mariadbd = require_binary("mariadbd", "mysqld")
        self._install_db = require_binary("mariadb-install-db", "mysql_install_db")
        super().__init__(port=port, extra_args=extra_args, startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.database = database
        self.socket_path = os.path.join(self.socket_dir, "mysql.sock")

    @property
    def dsn(self) -> str:
        """``mysql://root@127.0.0.1:PORT/<database>``."""
        return f"mysql://root@{self.host}:{self._port}/{self.database}"

    def _common_args(self) -> list[str]:
        # A private tmpdir: servers started at once must not share /tmp's temporary tables (mariadb-install-db
        # failed with "Could not remove temporary table '/tmp/#sql-temptable-...'" when two ran side by side).
        tmpdir = os.path.join(self._dir, "tmp")
        os.makedirs(tmpdir, exist_ok=True)
        args = [
            f"--tmpdir={tmpdir}",
            "--innodb-buffer-pool-size=16M",
            "--innodb-log-file-size=8M",
        ]
        if os.geteuid() == 0:
            args.append("--user=root")
        return args

    def _prepare(self) -> None:
        run_bounded(
            [
                self._install_db,
                "--no-defaults",
                f"--datadir={self.data_dir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                *self._common_args(),
            ],
            log_path=self.log_path,
            timeout=120.0,
            what="mariadb-install-db",
            cwd=self._dir,
        )

    def _argv(self) -> list[str]:
        return [
            self._mariadbd,
            "--no-defaults",
            f"--datadir={self.data_dir}",
            f"--port={self._port}",
            f"--bind-address={LOOPBACK}",
            f"--socket={self.socket_path}",
            f"--pid-file={os.path.join(self._dir, 'mariadbd.pid')}",
            *self._common_args(),
            "--skip-name-resolve",
            "--skip-log-bin",
            "--innodb-flush-log-at-trx-commit=1",
            "--innodb-doublewrite=0",
            "--max-connections=500",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
            *self.extra_args,
        ]

    def _connect(self, *, database: str | None, timeout: float, user: str = "root", password: str = "") -> Any:
        import pymysql

        return pymysql.connect(
            host=self.host,
            port=self._port,
            user=user,
            password=password,
            database=database,
            connect_timeout=timeout,
            read_timeout=timeout,
            write_timeout=timeout,
            autocommit=True,
        )

    def _probe(self) -> bool:
        conn = self._connect(database=None, timeout=2.0)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
                return bool(cur.fetchone() == (1,))
        finally:
            conn.close()

    def _after_start(self) -> None:
        self.query(f"CREATE DATABASE IF NOT EXISTS {_quote_ident(self.database)}", database="")

    def query(
        self,
        sql: str,
        args: Sequence[Any] | dict[str, Any] | None = None,
        *,
        database: str | None = None,
        timeout: float = 5.0,
    ) -> list[tuple[Any, ...]]:
        """Run one statement as root on a new short-lived connection (autocommit).

        ``args`` uses pymysql's ``%s`` / ``%(name)s`` placeholders.  Returns
        all rows (``[]`` for statements without a result set).  Connect, read
        and write are each bounded by ``timeout`` seconds, so this raises
        (``pymysql.err.OperationalError``) instead of hanging on a frozen
        server.  ``database=""`` connects without selecting a database.
        Blocking: do not call it from a latency-sensitive event loop.
        """
        db = self.database if database is None else (database or None)
        conn = self._connect(database=db, timeout=timeout)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                rows = cur.fetchall() if cur.description else ()
                return [tuple(row) for row in rows]
        finally:
            conn.close()

    def connection_ids(self, user: str | None = None) -> list[int]:
        """IDs of client connections (excluding the one used to ask), optionally of one user."""
        sql = (
            "SELECT ID FROM information_schema.PROCESSLIST "
            "WHERE ID <> CONNECTION_ID() AND COMMAND <> 'Daemon' AND USER <> 'system user'"
        )
        if user is None:
            rows = self.query(sql, database="")
        else:
            rows = self.query(sql + " AND USER = %s", (user,), database="")
        return [int(row[0]) for row in rows]

    def kill_connections(self, user: str | None = None) -> int:
        """``KILL`` every client connection (optionally of one user); return how many."""
        killed = 0
        for conn_id in self.connection_ids(user):
            try:
                self.query(f"KILL {int(conn_id)}", database="")
                killed += 1
            except Exception as exc:
                if "Unknown thread id" not in str(exc):
                    raise
        return killed

    def create_user(self, user: str, password: str, database: str | None = None) -> str:
        """Create (or reset) ``user``@'%' with ``password`` and all privileges on ``database``.

        ``database`` defaults to :attr:`database` and is created if missing.
        Returns a DSN ``mysql://user:password@127.0.0.1:PORT/database``.
        """
        db = self.database if database is None else database
        self.query(f"CREATE DATABASE IF NOT EXISTS {_quote_ident(db)}", database="")
        self.query("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (user, password), database="")
        self.query("ALTER USER %s@'%%' IDENTIFIED BY %s", (user, password), database="")
        self.query(f"GRANT ALL PRIVILEGES ON {_quote_ident(db)}.* TO %s@'%%'", (user,), database="")
        quote = urllib.parse.quote
        return f"mysql://{quote(user, safe='')}:{quote(password, safe='')}@{self.host}:{self._port}/{quote(db)}"
