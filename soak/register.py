"""The fenced register: one row per backend (per name, for the shards workload) on a PostgreSQL server that no
fault touches.

A write is accepted only if its token is at least the stored one; the
update and the history row are one statement, so the history's order (its
``id``) is the order in which the register accepted writes.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.harness import PostgresServer

    from .checker import Write

__all__ = ["Register", "SharedRegister", "create", "history"]

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS soak_register (key text PRIMARY KEY, token bigint NOT NULL)",
    "CREATE TABLE IF NOT EXISTS soak_history ("
    " id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL,"
    " writer text NOT NULL, sent_ns bigint NOT NULL)",
]

# Under READ COMMITTED a concurrent UPDATE waits for the row and re-checks the guard on the newer row.
_WRITE = """
WITH accepted AS (
    UPDATE soak_register SET token = $2 WHERE key = $1 AND token <= $2 RETURNING 1
)
INSERT INTO soak_history (key, token, writer, sent_ns) SELECT $1, $2, $3, $4 FROM accepted RETURNING id
"""


def create_tables(server: PostgresServer) -> None:
    """Create the tables if missing. Not concurrently with itself: two ``CREATE TABLE IF NOT EXISTS`` of one
    table at once can both go on and one fail (PostgreSQL's catalog), so the soak runs it once before the
    backends start."""
    for statement in _SCHEMA:
        server.query(statement)


def create(server: PostgresServer, key: str) -> None:
    """Create the tables (if missing) and an empty register ``key`` (token 0)."""
    create_tables(server)
    server.query("INSERT INTO soak_register (key, token) VALUES ($1, 0) ON CONFLICT (key) DO NOTHING", [key])


def history(server: PostgresServer, key: str) -> list[Write]:
    """Every write the register accepted for ``key``, in the order it accepted them."""
    from .checker import Write

    rows = server.query(
        "SELECT id, token, writer, sent_ns FROM soak_history WHERE key = $1 ORDER BY id", [key], timeout=60.0
    )
    return [Write(int(r[0]), int(r[1]), str(r[2]), int(r[3]), key) for r in rows]


class Register:
    """A candidate's connection to the register (asyncpg, imported by the candidate process only)."""

    def __init__(self, conn: Any, key: str) -> None:
        self._conn = conn
        self._key = key

    @classmethod
    async def connect(cls, dsn: str, key: str) -> Register:
        import asyncpg

        return cls(await asyncpg.connect(dsn, timeout=10.0), key)

    async def write(self, token: int, writer: str, sent_ns: int) -> bool:
        """True if the register accepted the write (``token`` at least the stored one), False if it refused it."""
        row = await self._conn.fetchval(_WRITE, self._key, token, writer, sent_ns, timeout=10.0)
        return row is not None

    async def aclose(self) -> None:
        await self._conn.close(timeout=5.0)


class SharedRegister:
    """A shards candidate's connections to the register: one row per name, ``KEY/NAME`` (asyncpg pool)."""

    def __init__(self, pool: Any, prefix: str) -> None:
        self._pool = pool
        self._prefix = prefix

    @classmethod
    async def connect(cls, dsn: str, prefix: str) -> SharedRegister:
        import asyncpg

        return cls(await asyncpg.create_pool(dsn, min_size=1, max_size=3, timeout=10.0), prefix)

    async def write(self, name: str, token: int, writer: str, sent_ns: int) -> bool:
        """True if the register accepted the write to ``name``'s row (``token`` at least the stored one)."""
        row = await self._pool.fetchval(_WRITE, f"{self._prefix}/{name}", token, writer, sent_ns, timeout=10.0)
        return row is not None

    async def aclose(self) -> None:
        await asyncio.wait_for(self._pool.close(), 5.0)
