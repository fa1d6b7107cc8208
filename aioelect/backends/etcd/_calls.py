"""Awaiting gRPC calls under anyio: :func:`settle` and :func:`first_of`.

Guarantees: a gRPC call awaited through :func:`settle` is cancelled with
its caller and never turns the caller's cancellation into one that anyio's
cancel scopes do not recognise; :func:`first_of` returns the first of
several waits and leaves none of the others running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from ._failures import Transient

__all__ = ["consume", "first_of", "settle"]

T = TypeVar("T")


async def settle(awaitable: Awaitable[T]) -> T:
    """Await a gRPC call (or anything that awaits one) safely.

    grpc.aio turns a cancellation it receives into a CancelledError of its
    own, which anyio cancel scopes (timeouts, task groups) do not recognise as
    theirs and let through. So the call runs in a helper task and we only wait
    for it: cancelling us raises our own CancelledError and cancels the call.
    A call cancelled under us (its channel closed) raises :class:`Transient`.
    """
    inner = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait([inner])
    except BaseException:
        inner.cancel()
        inner.add_done_callback(consume)
        raise
    if inner.cancelled():
        raise Transient("the etcd request was cancelled (channel closed)")
    return inner.result()


def consume(task: asyncio.Future[Any]) -> None:
    """Done callback: retrieve what ``task`` raised, so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


async def first_of(*waiters: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    """Run ``waiters`` concurrently; return (index, result) of the first to finish, cancelling the rest.

    If the first to finish raised, that exception is raised (never an
    exception group). The others are cancelled and waited for (never
    interrupted) before this returns or raises, cancellation included.
    Plain asyncio tasks rather than a task group: this is on the path of
    every handover (the leader's watch, the campaign's wait), where each
    step of a group's cancellation counts.
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
