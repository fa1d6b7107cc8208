"""aioelect.core._tasks.FirstFailure: the first task exception ends the group and is raised as it is."""

from __future__ import annotations

import anyio
import pytest

from aioelect.core._tasks import FirstFailure


async def test_the_first_exception_cancels_the_others_and_is_raised_unwrapped() -> None:
    cancelled: list[str] = []

    async def waits(name: str) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append(name)

    async def fails(message: str, after: float) -> None:
        await anyio.sleep(after)
        raise ValueError(message)

    with pytest.raises(ValueError, match=r"^first$"), anyio.fail_after(5):
        async with FirstFailure() as tasks:
            tasks.start_soon(waits, "a")
            tasks.start_soon(fails, "first", 0.01)
            tasks.start_soon(fails, "second", 0.02)
            await anyio.sleep_forever()
    assert cancelled == ["a"]


async def test_without_a_task_exception_the_block_ends_as_it_would() -> None:
    done: list[int] = []

    async def adds(n: int) -> None:
        done.append(n)

    async with FirstFailure() as tasks:
        tasks.start_soon(adds, 1)
        tasks.start_soon(adds, 2)
    assert sorted(done) == [1, 2] and tasks.failure is None
    with anyio.move_on_after(0.05) as scope:
        async with FirstFailure() as tasks:
            tasks.start_soon(anyio.sleep_forever)
    assert scope.cancelled_caught
