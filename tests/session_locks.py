"""Session-lock backends that misbehave on purpose, for the MySQL and PostgreSQL tests of the engine's checks."""

from __future__ import annotations

from typing import Any, TypeVar

from aioelect.backends.sql._session_lock import SessionLockBackend

B = TypeVar("B", bound=SessionLockBackend[Any])


def losing_its_first_grant(base: type[B]) -> tuple[type[B], list[int]]:
    """A subclass of ``base`` whose first granted lock is let go before the check after the grant, and the
    list that receives the session id of that grant."""
    lost: list[int] = []

    class LosesItsFirstGrant(base):  # type: ignore[valid-type,misc]
        async def _request(self, conn: Any) -> bool:
            return await self._lose_first(conn, await super()._request(conn))

        async def _try_request(self, conn: Any) -> bool:  # a campaign's first request does not wait
            return await self._lose_first(conn, await super()._try_request(conn))

        async def _lose_first(self, conn: Any, granted: bool) -> bool:
            if granted and not lost:
                lost.append(conn.session_id)
                await self._unlock(conn)  # the check after the grant must now fail
            return bool(granted)

    return LosesItsFirstGrant, lost


def unconfirmed_release(base: type[B]) -> type[B]:
    """A subclass of ``base`` whose release frees the lock, then reports the server's answer to a second release
    (not freed): a release the server did not confirm."""

    class UnconfirmedRelease(base):  # type: ignore[valid-type,misc]
        async def _unlock(self, conn: Any) -> bool:
            await super()._unlock(conn)
            return bool(await super()._unlock(conn))

    return UnconfirmedRelease


def releasing_its_lock_while_held(base: type[B]) -> type[B]:
    """A subclass of ``base`` whose first lock check while leading releases the lock on its own session first:
    the check then finds the lock no longer held by that session, as if another had taken it."""

    class ReleasesItsLock(base):  # type: ignore[valid-type,misc]
        released = False

        async def _held(self, conn: Any) -> bool:
            if not self.released:
                self.released = True
                await self._unlock(conn)
            return bool(await super()._held(conn))

    return ReleasesItsLock
