"""A table of allowed transitions between the states of one object, and its state diagram.

An object whose life has states keeps them in one enum and changes them only
through :meth:`Transitions.next`: a step the table does not list for the
current state changes nothing, so that every way in or out of a state is a
row of the table, and the diagram in the docs is drawn from the same rows
(:meth:`Transitions.mermaid`). Where no such step can be legitimate, the
owner raises on it instead (the etcd campaign's ``Tracker``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

__all__ = ["Transitions"]

_S = TypeVar("_S", bound=enum.Enum)
_T = TypeVar("_T", bound=enum.Enum)


class Transitions(Generic[_S, _T]):
    """Which step moves which state to which: ``(state, step) -> state``, and nothing else.

    ``start`` is the state every object begins in; ``final`` the states it
    ends in (no step leaves them).
    """

    def __init__(self, start: _S, final: frozenset[_S], table: Mapping[tuple[_S, _T], _S]) -> None:
        for state, _ in table:
            if state in final:
                raise ValueError(f"final state {state.name} has a way out")
        self.start = start
        self.final = final
        self._table = dict(table)

    def next(self, state: _S, step: _T) -> _S | None:
        """The state ``step`` moves ``state`` to, or None when the table does not allow that step from it."""
        return self._table.get((state, step))

    def __iter__(self) -> Iterator[tuple[_S, _T, _S]]:
        """Every row: ``(state, step, new state)``, in the table's order."""
        for (state, step), target in self._table.items():
            yield state, step, target

    def mermaid(self) -> str:
        """The table as a mermaid ``stateDiagram-v2`` (the docs' diagrams are this text, checked by a test)."""
        lines = ["stateDiagram-v2", f"    [*] --> {self.start.name}"]
        lines += [f"    {state.name} --> {target.name}: {step.value}" for state, step, target in self]
        lines += [f"    {state.name} --> [*]" for state in sorted(self.final, key=lambda s: s.name)]
        return "\n".join(lines) + "\n"
