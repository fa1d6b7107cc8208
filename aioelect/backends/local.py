"""The local backend: always leader at once, for single-instance development.

It owns nothing outside this process: tokens count up per name within it,
and there is no mutual exclusion with any other process.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, TypedDict

import anyio

from ..core._backend import Backend, Confirm, Hold, monotonic
from ..core._config import DEFAULT_NAME, check_options, validate_name

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["LocalBackend", "LocalOptions"]

# Tokens count up per name within this process: the only history local has.
_counters: dict[str, itertools.count[int]] = {}


class LocalOptions(TypedDict, total=False):
    """The options of a local election; :class:`LocalBackend` validates them."""

    #: A label for logs, and the name tokens are counted under (default ``aioelect/leader``).
    name: str


class _LocalHold(Hold):
    def __init__(self, backend: LocalBackend, identity: str, token: int) -> None:
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


class LocalBackend(Backend):
    """Leadership granted at once, never taken away; :meth:`leader` is this backend's holder."""

    kind = "local"

    def __init__(self, **options: Unpack[LocalOptions]) -> None:
        check_options("LocalElector", options, LocalOptions)
        super().__init__(validate_name(options.get("name", DEFAULT_NAME)))
        self.holder: str | None = None

    def describe_timing(self) -> str:
        return "local: always leader, nothing to renew (no protection against a second instance)"

    async def campaign(self, identity: str) -> Hold:
        await anyio.lowlevel.checkpoint()
        token = next(_counters.setdefault(self.name, itertools.count(1)))
        self.holder = identity
        return _LocalHold(self, identity, token)

    async def try_campaign(self, identity: str) -> Hold | None:
        return await self.campaign(identity)

    async def leader(self) -> str | None:
        return self.holder
