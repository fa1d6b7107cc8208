"""A throwaway PgBouncer on 127.0.0.1 in front of a harness PostgreSQL, in one pool mode.

As root, PgBouncer (which refuses to run as root) runs as the PostgreSQL
server's system account, which owns the directory.
"""

from __future__ import annotations

import os
import pwd
import signal
import socket
from typing import Literal

from ..binaries import require_binary
from ..lifecycle import OnePortServer
from ..processes import LOOPBACK
from .postgres import PostgresServer

__all__ = ["PgBouncer"]

#: Startup parameters PgBouncer drops instead of refusing the connection (it forwards only a few of its own).
IGNORED = (
    "search_path",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "client_connection_check_interval",
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
    "synchronous_commit",
    "extra_float_digits",
)


class PgBouncer(OnePortServer):
    """PgBouncer in ``pool_mode`` for every database of ``backend``, as user ``postgres`` (``auth_type=any``)."""

    kind = "pgbouncer"
    stop_signal = signal.SIGINT

    def __init__(
        self,
        backend: PostgresServer,
        pool_mode: Literal["session", "transaction", "statement"],
        *,
        startup_timeout: float = 15.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self._binary = require_binary("pgbouncer")
        super().__init__(port=None, extra_args=(), startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.backend = backend
        self.pool_mode = pool_mode
        self._user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            self._user = pwd.getpwnam("postgres")
            os.chown(self._dir, self._user.pw_uid, self._user.pw_gid)

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres`` through the pooler."""
        return f"postgresql://postgres@{self.host}:{self._port}/postgres"

    def _run_as(self) -> pwd.struct_passwd | None:
        return self._user

    def _argv(self) -> list[str]:
        config = os.path.join(self._dir, "pgbouncer.ini")
        with open(config, "w") as fh:
            fh.write(
                "[databases]\n"
                f"* = host={self.backend.host} port={self.backend.port} user=postgres\n"
                "[pgbouncer]\n"
                f"listen_addr = {LOOPBACK}\n"
                f"listen_port = {self._port}\n"
                "unix_socket_dir =\n"
                "auth_type = any\n"
                f"pool_mode = {self.pool_mode}\n"
                "default_pool_size = 4\n"
                f"ignore_startup_parameters = {','.join(IGNORED)}\n"
                f"logfile = {os.path.join(self._dir, 'pgbouncer.log')}\n"
            )
        if self._user is not None:
            os.chown(config, self._user.pw_uid, self._user.pw_gid)
        return [self._binary, config]

    def _probe(self) -> bool:
        try:
            with socket.create_connection((self.host, self._port), timeout=1.0):
                return True
        except OSError:
            return False
