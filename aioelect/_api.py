"""``leadership()``: the one-line way to run code only as leader.

It sits above the core and the factory: given no elector it builds one
from the environment with :func:`aioelect.from_env`, and closes it after.
The scope itself (campaign, run as leader work, release) is the core's
:func:`aioelect.core._elector.leading`, which :meth:`Elector.run` uses too.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Literal, overload

from .core._elector import Elector, Leadership, leading, leading_if_free
from .wiring._factory import from_env

__all__ = ["leadership"]


@overload
def leadership(
    elector: Elector | None = None, *, wait: Literal[True] = True, **options: Any
) -> contextlib.AbstractAsyncContextManager[Leadership]: ...


@overload
def leadership(
    elector: Elector | None = None, *, wait: Literal[False], **options: Any
) -> contextlib.AbstractAsyncContextManager[Leadership | None]: ...


@overload
def leadership(
    elector: Elector | None = None, *, wait: bool, **options: Any
) -> contextlib.AbstractAsyncContextManager[Leadership | None]: ...


def leadership(
    elector: Elector | None = None, *, wait: bool = True, **options: Any
) -> contextlib.AbstractAsyncContextManager[Leadership | None]:
    """Run the body only as leader.

    ``async with leadership(elector) as lead:`` campaigns, runs the body as
    leader, and releases leadership when the body ends. If leadership is lost
    the body is cancelled and :class:`LeadershipLost` is raised from the
    ``async with``. With no elector, one is built with :func:`aioelect.from_env`
    (``options`` are passed to it) and closed afterwards.

    Inside the body (and the tasks it starts) :func:`aioelect.current_leadership`
    returns ``lead``.

    With ``wait=False`` it does not wait for another leader: the body runs at
    once with ``lead`` None when another candidate leads (see
    :meth:`Elector.try_acquire`), as ``flock -n`` would give up::

        async with leadership(elector, wait=False) as lead:
            if lead is None:
                return  # another instance runs this job
            ...
    """
    if wait not in (True, False):
        raise TypeError(f"wait must be True or False, not {wait!r}")
    return _leadership(elector, wait, options)


@contextlib.asynccontextmanager
async def _leadership(elector: Elector | None, wait: bool, options: dict[str, Any]) -> AsyncIterator[Leadership | None]:
    scope = leading if wait else leading_if_free
    if elector is not None:
        if options:
            raise TypeError("leadership() takes options only when it builds the elector")
        async with scope(elector) as lead:
            yield lead
        return
    owned = from_env(**options)
    try:
        async with scope(owned) as lead:
            yield lead
    finally:
        await owned.aclose()
