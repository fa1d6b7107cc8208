"""A literal asyncio port of a minimal Go elector's ``mysqlElector.Acquire``: the baseline.

Kept deliberately faithful, flaws included:

* each attempt takes a *new* connection (``e.db.Conn(ctx)``) and, when
  ``GET_LOCK(name, 0)`` fails, never gives it back (no ``conn.Close()``): Go's
  pool then opens another one next time, so every poll leaks a connection.
  The leaked connections are kept referenced here, as database/sql keeps
  them checked out (Python would otherwise close them on garbage collection);
* followers poll every 2 s instead of waiting on the lock;
* once acquired, nothing is ever checked again: the process acts as leader
  until it releases (``DO RELEASE_LOCK`` then close, on context cancellation).
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import aiomysql

from ._runner import Candidate, Options, main

_leaked: list[Any] = []


class BaselineMySQL(Candidate):
    def __init__(self, options: Options) -> None:
        url = urllib.parse.urlsplit(options.url)
        self.connect_args: dict[str, Any] = {
            "host": url.hostname,
            "port": url.port or 3306,
            "user": urllib.parse.unquote(url.username or "root"),
            "password": urllib.parse.unquote(url.password or ""),
            "db": url.path.lstrip("/") or None,
            "autocommit": True,
        }
        self.lock_name = options.name
        self.conn: Any = None

    async def campaign(self) -> None:
        while True:
            conn = await aiomysql.connect(**self.connect_args)  # e.db.Conn(ctx)
            async with conn.cursor() as cur:
                await cur.execute("SELECT GET_LOCK(%s, 0)", (self.lock_name,))
                row = await cur.fetchone()
            acquired = row[0] if row else 0
            if acquired == 1:
                self.conn = conn
                return
            _leaked.append(conn)  # never closed, never returned to the pool
            await asyncio.sleep(2)  # case <-time.After(2 * time.Second)

    def acting(self) -> bool:
        return self.conn is not None  # never checked again after Acquire returned

    async def release(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        try:
            async with conn.cursor() as cur:
                await cur.execute("DO RELEASE_LOCK(%s)", (self.lock_name,))
        finally:
            conn.close()


def make(options: Options, slot: int) -> Candidate:
    return BaselineMySQL(options)


if __name__ == "__main__":
    main(make)
