"""Fenced state on Redis: a hash beside the election's keys (one slot), written by one script that checks the token.

The script compares the election's token counter with the writer's token,
then the expected value, then writes: one atomic step on the server. A
value is as durable as the server's persistence makes any write
(``appendfsync always`` for every acknowledged one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from redis import exceptions as rexc
from redis.asyncio import Redis

from ...core._backend import Hold, StateStore, Written
from ...core._errors import BackendUnavailable, ElectionError
from ._scripts import STATE_WRITE

__all__ = ["RedisStateStore"]

_SHA = hashlib.sha1(STATE_WRITE.encode()).hexdigest()
_WRITTEN = {1: Written.DONE, 0: Written.FENCED, 2: Written.CONFLICT}


class Owner(Protocol):
    """What the store needs of its backend."""

    def state_client(self) -> Redis: ...

    async def drop_state_client(self) -> None: ...

    def send(self, what: str, call: Callable[[], Awaitable[Any]]) -> Awaitable[Any]: ...

    def failure(self, exc: BaseException, what: str) -> ElectionError: ...

    async def confirm_state_write(self, client: Redis) -> None: ...


class RedisStateStore(StateStore):
    def __init__(self, backend: Owner, token_key: str, state_key: str) -> None:
        self._backend = backend
        self._keys = (token_key, state_key)

    async def _run(self, what: str, call: Callable[[Redis], Awaitable[Any]]) -> Any:
        try:
            client = self._backend.state_client()
            return await self._backend.send(what, lambda: call(client))
        except Exception as exc:
            await self._backend.drop_state_client()
            raise self._backend.failure(exc, f"the {what}") from None

    async def read(self, key: str) -> bytes | None:
        async def hget(client: Redis) -> Any:
            commands: Any = client  # typed otherwise by each redis-py release
            return await commands.hget(self._keys[1], key)

        value = await self._run("state read", hget)
        return None if value is None else (value if isinstance(value, bytes) else str(value).encode())

    async def post(self, key: str, value: bytes) -> None:
        async def hset(client: Redis) -> Any:
            commands: Any = client  # typed otherwise by each redis-py release
            return await commands.hset(self._keys[1], key, value)

        await self._run("request", hset)

    async def write(self, hold: Hold, key: str, value: bytes, *, compare: bool, expected: bytes | None) -> Written:
        mode = "put" if not compare else ("absent" if expected is None else "equal")
        args = (str(hold.token), key, value, mode, expected or b"")

        async def script(client: Redis) -> Any:
            try:
                return await client.evalsha(_SHA, 2, *self._keys, *args)  # type: ignore[arg-type, misc, unused-ignore]
            except rexc.NoScriptError:
                return await client.eval(STATE_WRITE, 2, *self._keys, *args)  # type: ignore[arg-type, misc, unused-ignore]

        reply = await self._run("state write", script)
        if reply == -1:
            await self._backend.drop_state_client()  # the next write asks for the master again (through Sentinel)
            raise BackendUnavailable(f"the fenced write of {key!r} was refused: the server is not a master")
        if reply == 1:
            # Durable and replicated as the grant was (WAITAOF, WAIT with min_replicas), or not acknowledged: a value
            # written only on the master would be lost by a failover that keeps the token.
            try:
                await self._backend.confirm_state_write(self._backend.state_client())
            except Exception as exc:
                await self._backend.drop_state_client()
                raise BackendUnavailable(
                    f"the fenced write of {key!r} was applied on the master but not confirmed durable or replicated "
                    f"(it may be lost by a crash or a failover): {exc}"
                ) from None
        if reply not in _WRITTEN:
            raise ElectionError(f"the state script answered {reply!r}, not 0, 1 or 2")
        return _WRITTEN[reply]
