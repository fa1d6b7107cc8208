"""``aioelect.run(main())``: :func:`asyncio.run` for a program that leads, stopped by SIGTERM as by Ctrl-C.

A process stopped by a signal's default action ends without unwinding its
tasks: a leadership it held is not released but left to its lease (etcd,
Redis), so a rolling deploy's ``kill PID`` costs a whole lease without a
leader. :func:`run` turns SIGTERM and SIGINT into a cancellation of ``main``,
so that every ``async with`` of aioelect unwinds: the leader's work stops,
then its leadership is released and the next candidate leads at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run"]

T = TypeVar("T")
log = logging.getLogger("aioelect")

#: The signals that stop ``main`` by cancelling it.
_STOPS = (signal.SIGTERM, signal.SIGINT)


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run ``main`` as :func:`asyncio.run` does, and stop it on SIGTERM or SIGINT by cancelling it.

    Guarantees, in the main thread:

    * a SIGTERM or SIGINT cancels ``main``'s task, so that its leaderships
      are released (their work stopped first) rather than left to expire;
    * once ``main`` has unwound, a SIGTERM ends the process with status
      143 (128 + SIGTERM), as ``aioelect run`` does, and a SIGINT raises
      :class:`KeyboardInterrupt`, as Ctrl-C does under :func:`asyncio.run`;
    * a second signal cancels ``main`` again (each cleanup of aioelect is
      bounded in time, so the process ends);
    * a signal the process was started with ignored (``SIG_IGN``: a shell's
      background job ignores SIGINT) stays ignored, as under
      :func:`asyncio.run`.

    ``main`` returning or raising by itself is passed through unchanged. Outside
    the main thread no signal handler can be set: ``main`` runs as under
    :func:`asyncio.run`, with a WARNING.
    """
    return asyncio.run(_stoppable(main), debug=debug)


async def _stoppable(main: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = loop.create_task(main)  # owned here: awaited below, whatever happens
    received: list[signal.Signals] = []

    def stop(signum: signal.Signals) -> None:
        received.append(signum)
        log.info("aioelect.run: %s received, stopping the program (leaderships are released)", signum.name)
        task.cancel()

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _STOPS:
            handler = signal.getsignal(signum)
            if handler == signal.SIG_IGN:
                continue  # ignored on purpose (a shell's background job ignores SIGINT): it stays ignored
            previous[signum] = handler
            loop.add_signal_handler(signum, stop, signum)
    else:
        log.warning(
            "aioelect.run outside the main thread: SIGTERM and SIGINT are not caught, and a process stopped by "
            "one leaves its leaderships to expire"
        )
    try:
        return await task
    except asyncio.CancelledError:
        if not received:
            raise
        if received[0] == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise SystemExit(128 + signal.SIGTERM) from None
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, handler)  # as they were before run(), not the defaults
