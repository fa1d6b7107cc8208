"""Background tasks with an owner, and the one way to wait for the first of several waits.

Guarantees: every task started through a :class:`TaskSet` belongs to the
object that holds the set, which cancels it and waits for it
(:meth:`TaskSet.aclose`) before it ends itself, so that no task outlives its
owner; :class:`FirstFailure` is a task group that ends at its first
exception and raises that one exception, as it is; :func:`first_of` returns
the first of several waits and leaves none of the others running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["FirstFailure", "TaskSet", "consume", "first_of"]

T = TypeVar("T")


def consume(task: asyncio.Future[Any]) -> None:
    """Done callback: retrieve what ``task`` raised, so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


class TaskSet:
    """The background tasks of one owner whose lifetime is not a scope (an object that outlives the call that
    started them): started by :meth:`start`, cancelled and awaited by :meth:`aclose`.

    A finished task leaves the set at once; :meth:`aclose` never returns
    while a task of the set still runs, and is never interrupted.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(
        self,
        coro: Coroutine[Any, Any, T],
        *,
        name: str,
        on_done: Callable[[asyncio.Task[T]], object] | None = None,
    ) -> asyncio.Task[T]:
        """Run ``coro`` as a task of this set; ``on_done`` is called when it finishes, however it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if on_done is not None:
            task.add_done_callback(on_done)
        return task

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        """The tasks still running."""
        return iter(list(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel(self) -> None:
        """Cancel every task of the set but the one calling (a task may end its own set)."""
        me = asyncio.current_task()
        for task in self._tasks:
            if task is not me:
                task.cancel()

    async def wait(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - a bound on a shielded wait
        """Wait, never interrupted, until every task but the calling one has finished, or ``timeout`` seconds.

        Returns whether they all have.
        """
        me = asyncio.current_task()
        others = [task for task in self._tasks if task is not me]
        if not others:
            return True
        with anyio.CancelScope(shield=True):
            _, pending = await asyncio.wait(others, timeout=timeout)
        return not pending

    async def aclose(self) -> None:
        """Cancel every task of the set and wait until they have finished. Never interrupted."""
        while len(self._tasks - {asyncio.current_task()}):  # a task may start another while it stops
            self.cancel()
            await self.wait()


class FirstFailure:
    """An anyio task group whose first task exception cancels the rest and is raised as it is, not in a group.

    ``async with FirstFailure() as tasks: tasks.start_soon(fn, *args)``: once
    every task has ended, the block raises the first :class:`Exception` a
    task raised (later ones are dropped: they are mostly the first one's
    consequences), else what the block itself raised, cancellation included.
    """

    def __init__(self) -> None:
        self._group = anyio.create_task_group()
        self.failure: Exception | None = None

    async def __aenter__(self) -> Self:
        await self._group.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        try:
            ended = await self._group.__aexit__(*exc_info)
        except BaseException:
            if self.failure is None:
                raise
            ended = None
        if self.failure is not None:
            raise self.failure
        return ended

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the group; its exception, if the first, ends the group and is raised by it."""
        self._group.start_soon(self._guard, fn, *args)

    async def _guard(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        try:
            await fn(*args)
        except Exception as exc:
            if self.failure is None:
                self.failure = exc
            self._group.cancel_scope.cancel()


async def first_of(*waiters: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    """Run ``waiters`` concurrently; return (index, result) of the first to finish, cancelling the rest.

    If the first to finish raised, that exception is raised (never an
    exception group). The others are cancelled and waited for (never
    interrupted) before this returns or raises, cancellation included.
    Plain asyncio tasks rather than a task group: this is on the path of
    every handover (etcd's watch of the leader, the campaign's wait), where
    each step of a group's cancellation counts.
    """
    tasks = [asyncio.ensure_future(waiter()) for waiter in waiters]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            with anyio.CancelScope(shield=True):
                await asyncio.wait(pending)
    index = next(i for i, task in enumerate(tasks) if task.done() and not task.cancelled())
    for other in tasks[index + 1 :]:
        consume(other)  # a second one may have finished too: its outcome is dropped, not left unretrieved
    return index, tasks[index].result()
