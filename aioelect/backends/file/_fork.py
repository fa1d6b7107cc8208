"""What a forked child must let go of: the descriptors it inherited from live campaigns and holds.

A ``flock`` belongs to the open file description, which a forked child
shares with its parent. A child that keeps its copies open therefore keeps
the parent's lock after the parent dies, keeps the parent's place in the
``.waiting`` queue (so every new campaign defers to a phantom waiter), and
hides the parent's closes from inotify (a description is closed only when
its last copy is). So every object that owns such descriptors is tracked
here, and in a forked child each one's ``forget()`` closes the child's
copies without unlocking: the parent's locks stay, they are the parent's.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["on_fork", "track", "untrack"]


class Forgettable(Protocol):
    def forget(self) -> None:
        """In a forked child: close this process's copies of the descriptors, unlocking nothing."""


_live: weakref.WeakSet[Forgettable] = weakref.WeakSet()
_hooks: list[Callable[[], None]] = []


def track(owner: Forgettable) -> None:
    """Have ``owner.forget()`` called in a child forked while ``owner`` lives (until :func:`untrack`)."""
    _live.add(owner)


def untrack(owner: Forgettable) -> None:
    _live.discard(owner)


def on_fork(hook: Callable[[], None]) -> None:
    """Call ``hook`` in every forked child, after the tracked owners forgot their descriptors."""
    _hooks.append(hook)


def _in_child() -> None:
    for owner in list(_live):
        owner.forget()
    _live.clear()
    for hook in _hooks:
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
