"""PostgreSQL under the adversary: the server and the operator's hand on it (``pg_terminate_backend``, restarts)."""

from __future__ import annotations

import random
from typing import Any, ClassVar

import anyio

from tests.harness import PostgresServer

from .servers import Target

__all__ = ["PostgresTarget"]


class PostgresTarget(Target):
    backend = "postgres"
    actions: ClassVar[dict[str, float]] = {"kill-holder": 3.0, "kill-session": 2.0, "restart": 1.0}
    pace = 1.5

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.server = PostgresServer()

    def target(self) -> Any:
        return self.server.dsn

    def newest_token(self) -> int | None:
        try:
            rows = self.server.query("SELECT token FROM public.aioelect_leaders WHERE name = $1", (self.name,))
        except Exception as exc:
            if "does not exist" in str(exc):
                return None  # no election has taken a token yet
            raise
        return int(rows[0][0]) if rows else None

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
