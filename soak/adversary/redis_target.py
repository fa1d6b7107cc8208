"""Redis under the adversary: the server, the operator's hand on it, the margin and the losses it must explain.

The server is a throwaway ``redis-server`` from ``tests/harness`` with the
append-only file synced on every write (``appendfsync always``), so that a
restart, even a crash, never takes a token back. The operator deletes the
lock key, overwrites it with a value of its own (with an expiry), shortens
its expiry (``PEXPIRE``), ends the holder's lock connection or another
client's (``CLIENT KILL``), and restarts the server (stopped gracefully, or
SIGKILLed, then started on the same port and data).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, ClassVar

import anyio

from soak.checker import Fault, Violation, claim
from soak.timing import OVERLAP_SLACK
from tests.harness import RedisServer

from .servers import Target

if TYPE_CHECKING:
    from aioelect.backends.redis._options import RedisSettings

__all__ = ["OPTIONS", "RedisTarget", "deposed", "margin"]

_NS = 1_000_000_000

#: The fault suite's and the soak's Redis timings (docs/guarantees.md).
OPTIONS: dict[str, Any] = {
    "lease": 3.0,
    "check_interval": 0.3,
    "check_timeout": 0.6,
    "renew_deadline": 2.0,
    "poll_interval": 1.0,
}

#: The operator's actions that take the lock key from its holder.
KEY_ACTIONS = ("delete-key", "overwrite-key", "expire-key")

#: What the Redis backend says when a renew finds the key gone or changed.
_KEY_GONE = "the lock key no longer holds our value"


def _settings(url: str, name: str) -> RedisSettings:
    # Imported here, not with the module: the adversary also runs against a library without the Redis backend
    # (scripts/adversary-old.sh on an older commit), where only the other targets are used.
    from aioelect.backends.redis._options import RedisSettings

    return RedisSettings.parse(url, {"name": name, **OPTIONS})


def identity_of(value: str | None) -> str | None:
    """The identity in a lock key's value (the Redis backend's own parsing)."""
    from aioelect.backends.redis._backend import identity_of as parse

    return parse(value)


def margin() -> float:
    """Seconds two leaders may both act, from the backend's own timing: see :func:`deposed_bound`, plus scheduling."""
    return deposed_bound() + OVERLAP_SLACK


def deposed_bound() -> float:
    """How long a Redis leader whose key an operator deleted, overwrote or expired may still act.

    Its next renew that the server answers in time sees the key gone:
    ``check_interval + 2 * check_timeout`` (:attr:`LockTiming.deposed_within`).
    A renew that fails (held back past ``check_timeout``, or its connection
    lost) does not end the leadership, as it must not: the key may still be
    there, and the leader goes on until its renew deadline, dated from the
    send of its last confirmed renew. So, when the network fails the renews,
    the bound is the renew deadline, which LockTiming keeps at least as long.
    """
    timing = _settings("redis://127.0.0.1:6379/0", "margin").timing
    return max(timing.deposed_within, timing.renew_deadline)


def deposed(losses: list[Any], faults: list[Fault], window: float) -> list[Violation]:
    """Redis leaders that lost their key while no operator action took it.

    A renew that finds the key gone or changed must be explained by a
    deletion, an overwrite or a shortened expiry of the key (one action, one
    loss) at most ``window`` seconds before; a leadership can begin after
    the action (the grant's reply was held back past it). The key survives
    a restart (append-only file), so a restart explains nothing.
    """
    found = []
    w = int(window * _NS)
    used: set[int] = set()
    for loss in sorted(losses, key=lambda loss: loss.at):
        if not loss.reason.startswith(_KEY_GONE):
            continue
        if not claim(faults, used, loss.at, w, KEY_ACTIONS):
            found.append(
                Violation(
                    "deposed",
                    f"{loss.who}'s leadership (token {loss.token}) ended: {loss.reason}; no operator action took "
                    "its key",
                    loss.at,
                )
            )
    return found


class RedisTarget(Target):
    backend = "redis"
    actions: ClassVar[dict[str, float]] = {
        "delete-key": 2.0,
        "overwrite-key": 1.5,
        "expire-key": 1.5,
        "kill-holder": 2.0,
        "kill-client": 1.0,
        "restart": 0.6,
    }
    pace = 0.8
    kinds = ("acquire", "renew", "release", "read leader", "subscribe", "release message")

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.server = RedisServer(appendfsync="always")  # type: ignore[assignment]

    def target(self) -> Any:
        assert isinstance(self.server, RedisServer)
        return self.server.url

    def lost(self, what: str) -> Exception:
        from redis.exceptions import ConnectionError as RedisConnectionError

        return RedisConnectionError(f"adversary: connection lost during {what or 'a command'}")

    @property
    def lock_key(self) -> str:
        """The lock key of the election :attr:`name` (as the backend names it)."""
        return _settings(self.target(), self.name).lock_key

    async def _command(self, *args: Any) -> Any:
        server = self.server
        assert isinstance(server, RedisServer)
        return await anyio.to_thread.run_sync(lambda: server.command(*args))

    async def act(self, action: str, rng: random.Random) -> str:
        if action != "restart":
            return await super().act(action, rng)
        server = self.server
        if rng.random() < 0.5:
            await anyio.to_thread.run_sync(server.restart)
            return "restarted (graceful stop)"

        def crash() -> None:
            server.kill()
            server.start()

        await anyio.to_thread.run_sync(crash)
        return "restarted (SIGKILL)"

    async def _holder(self) -> str | None:
        value = await self._command("GET", self.lock_key)
        return None if value is None else str(value)

    async def _delete_key(self, rng: random.Random) -> str:
        value = await self._holder()
        if value is None:
            return "no key"
        deleted = await self._command("DEL", self.lock_key)
        return f"DEL {self.lock_key} (held by {identity_of(value)})" if deleted else "no key (expired meanwhile)"

    async def _overwrite_key(self, rng: random.Random) -> str:
        # With an expiry: nobody renews the operator's value, so the election goes on once it expires.
        ms = rng.randint(300, 2500)
        done = await self._command("SET", self.lock_key, "operator", "PX", ms, "XX", "GET")
        if done is None:
            return "no key"
        return f"SET {self.lock_key} operator PX {ms} (was held by {identity_of(str(done))})"

    async def _expire_key(self, rng: random.Random) -> str:
        ms = rng.randint(1, 400)
        value = await self._holder()
        if value is None or not await self._command("PEXPIRE", self.lock_key, ms):
            return "no key"
        return f"PEXPIRE {self.lock_key} {ms} (held by {identity_of(value)})"

    async def _kill_holder(self, rng: random.Random) -> str:
        value = await self._holder()
        if value is None:
            return "no holder"
        holder = identity_of(value)
        for elector in self.electors:
            backend: Any = elector._backend  # private: the adversary finds the holder's connection
            if elector.identity != holder or backend.settings.name != self.name:
                continue
            client = backend._lock
            connection = getattr(client, "connection", None) if client is not None else None
            if connection is not None and not hasattr(connection, "_writer"):
                raise RuntimeError("redis-py's connection has no _writer: the holder's address cannot be found")
            writer = getattr(connection, "_writer", None)
            if writer is None:
                return f"no holder connection ({holder} has none open)"
            host, port = writer.get_extra_info("sockname")[:2]
            try:
                killed = await self._command("CLIENT", "KILL", "ADDR", f"{host}:{port}")
            except RuntimeError as exc:
                if "No such client" not in str(exc):
                    raise
                return f"no holder connection ({holder}'s {port} already closed)"
            return f"CLIENT KILL ADDR {host}:{port} ({holder}'s lock connection): {killed}"
        return f"no holder connection ({holder} is not one of ours)"

    async def _kill_client(self, rng: random.Random) -> str:
        listing = str(await self._command("CLIENT", "LIST"))
        ids = [
            line.split("id=", 1)[1].split(" ", 1)[0]
            for line in listing.splitlines()
            if line.startswith("id=") and "cmd=client|list" not in line
        ]
        if not ids:
            return "no client"
        chosen = rng.choice(ids)
        try:
            await self._command("CLIENT", "KILL", "ID", chosen)
        except RuntimeError as exc:
            if "No such client" not in str(exc):
                raise
            return f"no client ({chosen} closed meanwhile)"
        return f"CLIENT KILL ID {chosen}"

    async def leftovers(self) -> list[str]:
        listing = str(await self._command("CLIENT", "LIST"))
        others = [line for line in listing.splitlines() if line.startswith("id=") and "cmd=client|list" not in line]
        return [f"{len(others)} connection(s) left on Redis"] if others else []
