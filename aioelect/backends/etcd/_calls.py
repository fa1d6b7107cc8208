"""Awaiting gRPC calls under anyio: :func:`settle`.

Guarantees: a gRPC call awaited through :func:`settle` is cancelled with
its caller and never turns the caller's cancellation into one that anyio's
cancel scopes do not recognise. (:func:`~aioelect.core._tasks.first_of` and
:func:`~aioelect.core._tasks.consume` live beside the other owners of tasks.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from ...core._tasks import consume
from ._failures import Transient

__all__ = ["settle"]

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
