"""A throwaway PostgreSQL cluster (``initdb`` and ``postgres`` with a temporary data directory).

As root, the server runs as an unprivileged system account. ``asyncpg`` is
imported only when a server is queried.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import urllib.parse
from collections.abc import Sequence
from typing import Any

from ..binaries import require_binary, require_module
from ..errors import MissingBinaryError
from ..lifecycle import OnePortServer
from ..processes import LOOPBACK, run_bounded, run_coroutine

__all__ = ["PostgresServer"]


class PostgresServer(OnePortServer):
    """A throwaway PostgreSQL cluster on 127.0.0.1 (``initdb -A trust -U postgres``).

    When the test process runs as root, ``initdb`` and ``postgres`` run as the
    ``os_user`` system account (default ``postgres``), which owns the
    directory.  ``fsync=off``: data survives a server crash (``kill()``) but
    not an OS crash.  ``stop()`` uses a fast shutdown (SIGINT), and
    ``kill()``/``freeze()`` also reach the per-connection backend processes.
    """

    kind = "postgres"
    stop_signal = signal.SIGINT

    def __init__(
        self,
        *,
        port: int | None = None,
        os_user: str = "postgres",
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        require_module("asyncpg", "PostgresServer")  # start() and query() use it
        self._initdb = require_binary("initdb")
        self._postgres = require_binary("postgres", search_dirs=[os.path.dirname(self._initdb)])
        run_as: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                run_as = pwd.getpwnam(os_user)
            except KeyError:
                raise MissingBinaryError(
                    f"running as root but system user {os_user!r} (needed to run postgres) does not exist"
                ) from None
        super().__init__(port=port, extra_args=extra_args, startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self._user = run_as
        if run_as is not None:
            os.chown(self._dir, run_as.pw_uid, run_as.pw_gid)

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres``."""
        return f"postgresql://postgres@{self.host}:{self._port}/postgres"

    def _run_as(self) -> pwd.struct_passwd | None:
        return self._user

    def _prepare(self) -> None:
        argv = [self._initdb, "-A", "trust", "-U", "postgres", "-D", self.data_dir]
        argv += ["--no-sync", "--encoding=UTF8", "--locale=C"]
        run_bounded(argv, log_path=self.log_path, timeout=120.0, what="initdb", run_as=self._user, cwd=self._dir)

    def _argv(self) -> list[str]:
        settings = {
            "listen_addresses": LOOPBACK,
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            "max_connections": "200",
        }
        argv = [self._postgres, "-D", self.data_dir, "-p", str(self._port), "-k", self.socket_dir]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        return [*argv, *self.extra_args]

    def _pidfile_ready(self) -> bool:
        # pg_ctl's own readiness test: line 8 of postmaster.pid becomes "ready".
        try:
            with open(os.path.join(self.data_dir, "postmaster.pid")) as fh:
                lines = fh.read().splitlines()
        except OSError:
            return False
        if len(lines) < 8 or self._proc is None:
            return False
        return lines[0].strip() == str(self._proc.pid) and lines[7].strip() == "ready"

    def _probe(self) -> bool:
        if not self._pidfile_ready():
            return False
        return self.query("SELECT 1", timeout=2.0) == [(1,)]

    def query(
        self, sql: str, args: Sequence[Any] | None = None, *, database: str = "postgres", timeout: float = 5.0
    ) -> list[tuple[Any, ...]]:
        """Run one statement as ``postgres`` on a new short-lived connection.

        ``args`` uses ``$1``-style placeholders.  Returns all rows as tuples
        (``[]`` if none).  The whole call (connect + query + close) is bounded
        by ``timeout`` (raises ``TimeoutError``).  It runs asyncpg in a
        private event loop on a private thread, so it is safe to call from
        sync tests and from inside a running event loop (it blocks it).
        """
        import asyncpg

        params = list(args or ())
        dsn = f"postgresql://postgres@{self.host}:{self._port}/{urllib.parse.quote(database)}"

        async def run() -> list[tuple[Any, ...]]:
            conn = await asyncpg.connect(dsn, timeout=timeout)
            try:
                rows = await conn.fetch(sql, *params, timeout=timeout)
            except BaseException:
                conn.terminate()
                raise
            with contextlib.suppress(Exception):
                await conn.close(timeout=1.0)
            return [tuple(row) for row in rows]

        return run_coroutine(run, timeout)
