"""aioelect's pytest fixtures for users' tests; pytest loads them through the ``pytest11`` entry point.

* ``aioelect_name`` -- an election name no other test uses.
* ``memory_elector`` -- ``make(identity=None, **options) -> MemoryElector``
  for the test's ``aioelect_name`` (``name=`` picks another). Every elector
  it made is closed after the test, in the event loop it ran in, before that
  loop ends (a leader's work is stopped and its leadership released).

``memory_elector`` is an async fixture: pytest-asyncio runs it when it is
installed, otherwise anyio's pytest plugin does (for tests marked
``anyio``).
"""

from __future__ import annotations

import asyncio
import secrets
import warnings
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar, cast

import pytest

from .testing import MemoryElector

__all__ = ["aioelect_name", "memory_elector"]

#: How long closing one elector at teardown may take (a leader's work is stopped first).
CLOSE_TIMEOUT = 10.0

_F = TypeVar("_F", bound=Callable[..., Any])


def _async_fixture(func: _F) -> _F:
    """An async fixture for pytest-asyncio when it is installed, else for anyio's plugin."""
    try:
        from pytest_asyncio import fixture
    except ImportError:
        decorated: Any = pytest.fixture(func)
    else:
        decorated = fixture(func)
    return cast(_F, decorated)  # typed otherwise by each pytest and pytest-asyncio release


@pytest.fixture
def aioelect_name(request: pytest.FixtureRequest) -> str:
    """An election name no other test uses: the test's name and a random suffix."""
    return f"test/{request.node.name[:80]}/{secrets.token_hex(4)}"


@_async_fixture
async def memory_elector(aioelect_name: str) -> AsyncIterator[Callable[..., MemoryElector]]:
    """``make(identity=None, **options)``: a :class:`~aioelect.testing.MemoryElector` of this test's election.

    ``options`` are :class:`~aioelect.testing.MemoryElector`'s (``name``,
    ``renew_deadline``, ``check_interval``, ``stop_timeout``); ``name``
    defaults to ``aioelect_name``, so every elector made shares one election.
    """
    made: list[tuple[MemoryElector, asyncio.AbstractEventLoop | None]] = []

    def make(identity: str | None = None, **options: Any) -> MemoryElector:
        options.setdefault("name", aioelect_name)
        elector = MemoryElector(identity=identity, **options)
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        made.append((elector, loop))
        return elector

    yield make
    for elector, loop in made:
        await _close(elector, loop)


async def _close(elector: MemoryElector, loop: asyncio.AbstractEventLoop | None) -> None:
    """Close ``elector`` if it was made in this event loop (or outside any); one of a loop that ended ended with it."""
    if loop is not None and loop is not asyncio.get_running_loop():
        if not loop.is_closed():
            warnings.warn(
                f"aioelect memory_elector: {elector!r} was made in another event loop, which still runs; "
                "close it there (async with elector: ...)",
                stacklevel=1,
            )
        return
    try:
        await asyncio.wait_for(elector.aclose(), CLOSE_TIMEOUT)
    except Exception as exc:  # a failing close must not hide the test's own result
        warnings.warn(f"aioelect memory_elector: closing {elector!r} failed: {exc!r}", stacklevel=1)
