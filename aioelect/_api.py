"""``leadership()``: the one-line way to run code only as leader.

It sits above the core and the factory: given no elector it builds one
from the environment with :func:`aioelect.from_env`, and closes it after.
The scope itself (campaign, run as leader work, release) is the core's
:func:`aioelect._elector.leading`, which :meth:`Elector.run` uses too.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from ._elector import Elector, Leadership, leading
from ._factory import from_env

__all__ = ["leadership"]


@contextlib.asynccontextmanager
async def leadership(elector: Elector | None = None, **options: Any) -> AsyncIterator[Leadership]:
    """Run the body only as leader.

    ``async with leadership(elector) as lead:`` campaigns, runs the body as
    leader, and releases leadership when the body ends. If leadership is lost
    the body is cancelled and :class:`LeadershipLost` is raised from the
    ``async with``. With no elector, one is built with :func:`aioelect.from_env`
    (``options`` are passed to it) and closed afterwards.
    """
    if elector is not None:
        if options:
            raise TypeError("leadership() takes options only when it builds the elector")
        async with leading(elector) as lead:
            yield lead
        return
    owned = from_env(**options)
    try:
        async with leading(owned) as lead:
            yield lead
    finally:
        await owned.aclose()
