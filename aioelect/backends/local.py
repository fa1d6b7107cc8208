"""The local backend: always leader at once, for single-instance development."""

from __future__ import annotations

import itertools

import anyio

from .._backend import Backend, Confirm, Hold, monotonic
from .._elector import Elector

__all__ = ["LocalElector"]

# Tokens count up per name within this process: the only history local has.
_counters: dict[str, itertools.count[int]] = {}


class _LocalHold(Hold):
    def __init__(self, backend: _LocalBackend, identity: str, token: int) -> None:
        self._backend = backend
        self._identity = identity
        self.token = token
        self.acquired_at = monotonic()

    async def monitor(self, confirm: Confirm) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def release(self) -> None:
        if self._backend.holder == self._identity:
            self._backend.holder = None


class _LocalBackend(Backend):
    kind = "local"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.holder: str | None = None

    def describe_timing(self) -> str:
        return "local: always leader, nothing to renew (no protection against a second instance)"

    async def campaign(self, identity: str) -> Hold:
        await anyio.lowlevel.checkpoint()
        token = next(_counters.setdefault(self.name, itertools.count(1)))
        self.holder = identity
        return _LocalHold(self, identity, token)

    async def leader(self) -> str | None:
        return self.holder


class LocalElector(Elector):
    """Always the leader at once: for a single instance in development.

    Offers no mutual exclusion between processes. Tokens increase within the
    process for each name. :meth:`leader` reports this elector's identity
    while it leads, None otherwise.
    """

    def __init__(
        self, *, name: str = "aioelect/leader", identity: str | None = None, stop_timeout: float = 5.0
    ) -> None:
        from .._config import validate_name

        super().__init__(_LocalBackend(validate_name(name)), identity=identity, stop_timeout=stop_timeout)
