"""Stop signals that arrive while the ``aioelect`` command is still starting, kept for it.

A PID namespace's init (a container's first process) is not sent a signal it
has no handler for: the kernel drops it. ``python -m aioelect`` and the
``aioelect`` script call :func:`hold` before they import the rest of the
package, which takes a few hundred milliseconds: from then on each stop
signal whose disposition is the default is recorded, and :func:`take` hands
the command those it handles once its own handlers are in place, and gives
the others their default action back (a signal the command does not handle
then acts as it would have). A signal that is ignored stays ignored.
Standard library only: importing this module must cost nothing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Collection
from types import FrameType

__all__ = ["hold", "take"]

#: SIGINT is not among them: Python's own handler already takes it (KeyboardInterrupt), from its start.
_HELD = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_received: list[int] = []
_installed: list[signal.Signals] = []


def _record(signum: int, _frame: FrameType | None) -> None:
    _received.append(signum)


def hold() -> None:
    """Record, from now until :func:`take`, every stop signal whose disposition is the default."""
    for sig in _HELD:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _record)
            _installed.append(sig)


def take(handled: Collection[signal.Signals]) -> list[signal.Signals]:
    """The signals of ``handled`` received since :func:`hold`, in order, for a command whose own handlers are now
    in place; every other one held gets its default disposition back, and one of them received meanwhile is
    raised again (with its default action)."""
    for sig in _installed:
        if sig not in handled and signal.getsignal(sig) is _record:
            signal.signal(sig, signal.SIG_DFL)
    _installed.clear()
    received, _received[:] = list(_received), []
    for signum in received:
        if signum not in handled:
            os.kill(os.getpid(), signum)
    return [signal.Signals(signum) for signum in received if signum in handled]
