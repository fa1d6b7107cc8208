"""Fenced state: small values kept in the election's own backend, written only under the newest token."""

from __future__ import annotations

from typing import Any

from .core._backend import StateStore, Written
from .core._elector import Elector, Leadership, backend_of, elector_of, hold_of, is_closed
from .core._errors import ElectorClosed, LeadershipLost, LossKind, UsageError
from .core._values import check_key, decode, encode

__all__ = ["FencedStore"]


class FencedStore:
    """Small values (a cursor, a checkpoint, the last tick run) kept beside ``elector``'s election on its server.

    ``await store.get(key)`` works from any candidate;
    ``await store.put(lead, key, value)`` and
    ``await store.compare_and_set(lead, key, expected, value)`` write.

    Guarantees:

    * a write commits only if ``lead``'s token is the newest the election
      has issued, checked on the server in the same atomic step as the write
      (etcd: one transaction comparing the leader key's create revision;
      MySQL and PostgreSQL: the token row, locked in the write's
      transaction; Redis: one script; file: under the state file's lock;
      memory: the election's counter). Otherwise it raises
      :class:`~aioelect.LeadershipLost` and nothing is written. A leader
      frozen after its last check, deposed meanwhile, and woken with its
      write in flight is refused by the server, whatever its own clock says;
    * a write by a leadership that is not :attr:`~aioelect.Leadership.held`
      any more is refused before anything is sent;
    * bad input writes nothing: a value that is not JSON (TypeError), one
      larger than 64 KiB as JSON or ``None`` (ValueError), a bad key
      (ValueError), a leadership of another elector
      (:class:`~aioelect.UsageError`);
    * a backend without fenced state (local) raises
      :class:`~aioelect.UsageError` at construction.

    Values are stored as canonical JSON (:mod:`aioelect.core._values`), so
    ``get`` returns what JSON gives back (a tuple comes back a list).
    """

    def __init__(self, elector: Elector) -> None:
        if not isinstance(elector, Elector):
            raise TypeError(f"FencedStore() takes an Elector, not {type(elector).__name__}")
        self._elector = elector
        if is_closed(elector):
            raise ElectorClosed(f"FencedStore() of {elector!r}: the elector is closed")
        self._store: StateStore = backend_of(elector).state_store()

    def __repr__(self) -> str:
        return f"<FencedStore {self._elector.backend}:{self._elector.name}>"

    def _open(self) -> StateStore:
        if is_closed(self._elector):
            raise ElectorClosed(f"{self!r}: its elector is closed")
        return self._store

    async def get(self, key: str) -> Any:
        """The value stored under ``key``, or None if it has none."""
        key = check_key(key)
        return decode(await self._open().read(key))

    async def put(self, lead: Leadership, key: str, value: Any) -> None:
        """Store ``value`` under ``key`` if ``lead``'s token is the newest: else LeadershipLost, nothing written."""
        await self._write(lead, key, value, compare=False, expected=None)

    async def compare_and_set(self, lead: Leadership, key: str, expected: Any, value: Any) -> bool:
        """Store ``value`` under ``key`` only if it now holds ``expected`` (None: no value) and ``lead``'s token is
        the newest. True if written; False (nothing written) if the value differed; LeadershipLost if fenced."""
        wanted = None if expected is None else encode(expected)
        return await self._write(lead, key, value, compare=True, expected=wanted)

    async def _write(self, lead: Leadership, key: str, value: Any, *, compare: bool, expected: bytes | None) -> bool:
        key = check_key(key)
        data = encode(value)
        if not isinstance(lead, Leadership):
            raise TypeError(f"a fenced write takes the writer's Leadership, not {type(lead).__name__}")
        if (other := elector_of(lead)) is not self._elector:
            raise UsageError(
                f"{lead!r} is a leadership of another elector ({other.backend}:{other.name}); "
                f"this store is fenced by {self._elector.backend}:{self._elector.name}'s tokens"
            )
        if lead.token is None:
            raise UsageError(f"{lead!r} has no fencing token (fencing=False): fenced state needs tokens")
        store = self._open()
        lead.check()
        written = await store.write(hold_of(lead), key, data, compare=compare, expected=expected)
        if written is Written.FENCED:
            raise LeadershipLost(
                f"fenced write of {key!r} refused: the election has issued a token newer than {lead.token}",
                LossKind.DEPOSED,
            )
        return written is Written.DONE
