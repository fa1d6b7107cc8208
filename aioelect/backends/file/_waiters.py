"""The waiters' queue: a campaign that starts while others wait lets one of them take the lock first.

Without it, a leader that releases and campaigns again at once finds the
lock free before any follower woke up, and wins again nearly every time
where followers poll. Waiting candidates therefore announce themselves
with a *shared* ``flock`` on ``path + ".waiting"`` (dropped by the kernel if
they die). A campaign that starts first tries ``LOCK_EX | LOCK_NB`` on that
file, which fails only if someone else waits; if so it stays out of the race
until one of the waiters leaves the queue (a winner closes its ``.waiting``
descriptor at once, which inotify reports) or, at most, the backend's
``handover`` bound (a frozen or very slow waiter), then tries.

Guarantees: a campaign's descriptors live in one :class:`Attempt`, closed by
:meth:`Attempt.close` however the campaign ends, even one a worker thread
opens after the campaign was cancelled (a forked child closes its copies,
unlocking nothing); a waiter stays announced while it waits, and
leaves the queue the moment it wins.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import threading

from . import _fork
from ._inotify import LockFileSignals, Watcher
from ._paths import close_fd

__all__ = ["Attempt", "announce", "rejoin"]


class Attempt:
    """The descriptors of one campaign: the lock file, and our place in the ``.waiting`` queue."""

    def __init__(self) -> None:
        self.lock_fd = -1
        self.waiting_fd = -1
        self.announced = False
        self._closed = False
        self._guard = threading.Lock()
        _fork.track(self)

    def adopt(self, which: str, fd: int) -> None:
        """Keep ``fd`` as ``lock_fd`` or ``waiting_fd`` (worker threads). A descriptor opened after
        :meth:`close` is closed at once: a ``task.cancel()`` can end the campaign while its worker thread
        still opens files, and nothing else would close what the thread opens then."""
        with self._guard:
            if not self._closed:
                setattr(self, which, fd)
                return
        close_fd(fd)
        raise OSError(errno.ECANCELED, "the campaign ended while its lock file was being opened")

    def take_lock_fd(self) -> int:
        fd, self.lock_fd = self.lock_fd, -1
        return fd

    def leave_queue(self) -> None:
        """Close our ``.waiting`` descriptor: drops our shared lock, and tells deferring campaigns."""
        fd, self.waiting_fd = self.waiting_fd, -1
        self.announced = False
        if fd >= 0:
            close_fd(fd)

    def close(self) -> None:
        with self._guard:
            self._closed = True
        _fork.untrack(self)
        self.leave_queue()
        fd = self.take_lock_fd()
        if fd >= 0:
            close_fd(fd)  # closing drops a lock we may already hold

    def forget(self) -> None:
        """In a forked child: close our copies; the parent's locks stay (they belong to the shared file)."""
        for fd in (self.lock_fd, self.waiting_fd):
            if fd >= 0:
                close_fd(fd)
        self.lock_fd = self.waiting_fd = -1
        self.announced = False


def announce(attempt: Attempt, watcher: Watcher, channel: LockFileSignals, wd: int) -> asyncio.Event | None:
    """Join the ``.waiting`` queue on ``attempt.waiting_fd`` (watched as ``wd``); if other candidates were
    waiting already, return the event that fires when one of them leaves it (None: nobody waits)."""
    # Registered and read before looking, so that a waiter leaving after our look is not missed.
    watched = watcher.register(wd, channel.left)
    left = channel.left.event
    try:
        fcntl.flock(attempt.waiting_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # succeeds only if nobody holds it shared
        others = False
    except BlockingIOError:
        others = True
    rejoin(attempt)
    if not others:
        return None
    # Without inotify nobody tells us when a waiter leaves: an event that never fires.
    return left if watched else asyncio.Event()


def rejoin(attempt: Attempt) -> None:
    """Hold the ``.waiting`` lock shared (converting our probe's exclusive lock, if any)."""
    if attempt.waiting_fd < 0:
        return
    try:
        fcntl.flock(attempt.waiting_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        attempt.announced = True
    except BlockingIOError:
        # Another newcomer's probe holds it exclusively for an instant: try again after our next try.
        attempt.announced = False
