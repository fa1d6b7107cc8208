"""Fenced state on the session-lock databases: a table beside the token row, written in one transaction with it.

A write runs on a connection of its own (never the lock session, which the
keeper confirms on) in one transaction: the election's token row is read
under a lock, the write is refused unless it holds the writer's token, the
expected value is compared, and the value written; the token row's lock
makes a new leader's token bump wait until that transaction has ended, so
a write either commits before the next leadership is handed out or not at
all. The connection's idle bounds are the election's ``lease``: a leader
frozen inside that transaction holds the next grant up for ``lease`` at most.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio

from ...core._backend import Hold, StateStore, Written
from ...core._errors import ElectionError

__all__ = ["SqlStateStore"]

_C = TypeVar("_C")
_T = TypeVar("_T")


class SqlStateStore(StateStore, Generic[_C]):
    """One connection, opened on first use and kept until :meth:`aclose`, one transaction at a time; a dialect
    says the statements.

    The server ends the kept connection once it sits idle for ``lease``: a
    read or a transaction's ``BEGIN`` that fails on a kept connection runs
    once more on a new one (neither changes anything on the server).
    """

    def __init__(self) -> None:
        self._conn: _C | None = None
        self._lock = anyio.Lock()

    @abc.abstractmethod
    async def _open(self) -> _C:
        """A new connection with the session's bounds set to ``lease``, the state table ready."""

    @abc.abstractmethod
    def _close(self, conn: _C) -> None:
        """Drop ``conn`` at once (the server rolls back what it had open)."""

    @abc.abstractmethod
    def _broken(self, conn: _C) -> bool:
        """Whether ``conn`` can no longer be used."""

    @abc.abstractmethod
    def _failure(self, exc: Exception, what: str) -> ElectionError:
        """What to raise for ``exc``, caught while doing ``what``."""

    @abc.abstractmethod
    async def _read(self, conn: _C, key: str) -> bytes | None:
        """The value of ``key``, read outside any transaction."""

    # The fenced write's statements, in the order :meth:`_transaction` runs them in one transaction.

    @abc.abstractmethod
    async def _begin(self, conn: _C) -> None:
        """Begin a transaction."""

    @abc.abstractmethod
    async def _newest_token(self, conn: _C) -> int | None:
        """The election's token row, read under a lock held until the transaction ends (None: no row)."""

    @abc.abstractmethod
    async def _held_by(self, conn: _C, session: int) -> bool:
        """Whether the election's lock is held by the server's session ``session``."""

    @abc.abstractmethod
    async def _locked_value(self, conn: _C, key: str) -> bytes | None:
        """The value of ``key``, its row locked until the transaction ends."""

    @abc.abstractmethod
    async def _put(self, conn: _C, key: str, value: bytes, token: int) -> None:
        """Store ``value`` under ``key``, recorded as written by ``token``."""

    @abc.abstractmethod
    async def _end(self, conn: _C, *, commit: bool) -> None:
        """Commit or roll back the transaction."""

    async def _transaction(
        self, conn: _C, token: int, session: int | None, key: str, value: bytes, compare: bool, expected: bytes | None
    ) -> Written:
        """The fenced write as one transaction, begun by the caller and ended here: refused unless the token row
        holds ``token`` and, when ``session`` is known, the election's lock is still held by that session (a
        candidate that takes no token, ``fencing=False``, leaves the token row as it was)."""
        newest = await self._newest_token(conn)
        written = Written.FENCED
        if newest == token and (session is None or await self._held_by(conn, session)):
            written = Written.DONE
            if compare and await self._locked_value(conn, key) != expected:
                written = Written.CONFLICT
        if written is Written.DONE:
            await self._put(conn, key, value, token)
        await self._end(conn, commit=written is Written.DONE)
        return written

    async def _connection(self) -> _C:
        if self._conn is not None and not self._broken(self._conn):
            return self._conn
        with anyio.CancelScope(shield=True):  # a connect cut off half-way would leave a session behind
            fresh = await self._open()
        self._conn = fresh
        return fresh

    async def _again_if_kept(self, step: Callable[[_C], Awaitable[_T]]) -> _T:
        """``step(conn)`` on the connection; if it fails on a kept one (the server may have ended it while it sat
        idle), once more on a new connection."""
        kept = self._conn is not None and not self._broken(self._conn)
        conn = await self._connection()
        try:
            return await step(conn)
        except Exception:
            if not kept:
                raise
            self._drop()
        return await step(await self._connection())

    async def read(self, key: str) -> bytes | None:
        async with self._lock:
            try:
                return await self._again_if_kept(lambda conn: self._read(conn, key))
            except BaseException as exc:
                # A read cut off (a cancellation, a timeout) leaves its reply on the connection: never reused.
                self._drop()
                if isinstance(exc, Exception):
                    raise self._failure(exc, "the state read") from exc
                raise

    @abc.abstractmethod
    async def _post(self, conn: _C, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` with no token check (token 0 recorded), committed at once."""

    async def post(self, key: str, value: bytes) -> None:
        async with self._lock:
            try:
                # Not again on a new connection: a post whose reply was lost may have committed, and a second one
                # could replace a request another process posted in between.
                await self._post(await self._connection(), key, value)
            except BaseException as exc:
                self._drop()
                if isinstance(exc, Exception):
                    raise self._failure(exc, "the request") from exc
                raise

    async def _begun(self) -> _C:
        """A connection with a transaction begun on it.

        A kept connection that the server ended while it sat idle (a leader
        frozen longer than ``lease`` finds it gone) fails at ``BEGIN``,
        before anything of the write was sent: the transaction is begun once
        more on a new connection, where the fence answers.
        """

        async def begin(conn: _C) -> _C:
            await self._begin(conn)
            return conn

        return await self._again_if_kept(begin)

    async def write(self, hold: Hold, key: str, value: bytes, *, compare: bool, expected: bytes | None) -> Written:
        assert hold.token is not None
        async with self._lock:
            try:
                session = getattr(hold, "session_id", None)
                conn = await self._begun()
                return await self._transaction(conn, hold.token, session, key, value, compare, expected)
            except BaseException as exc:
                # Whatever the transaction left open ends with the session: nothing half-written commits.
                self._drop()
                if isinstance(exc, Exception):
                    raise self._failure(exc, "the fenced write") from exc
                raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._close(conn)

    async def aclose(self) -> None:
        self._drop()
