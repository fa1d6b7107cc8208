"""The inotify wait: one inotify instance per event loop, waking the campaigns on a lock file's closes.

Owns the ctypes binding (``inotify_init1``, ``inotify_add_watch``; ``os``
does the reads and closes), the per-loop :class:`Watcher` and its
registry. Guarantees:

* a :class:`Signal` fires at every close of a watched file reported after
  its ``event`` was read, so a waiter that reads ``event`` before looking
  at the lock never misses a close after its look;
* a queue overflow or a failed read fires every signal (nobody sleeps
  through a close the kernel dropped); after a failed read the watcher is
  dead (``live`` False) and campaigns poll;
* only non-blocking reads of the inotify descriptor run on the loop; its
  close, which waits for a kernel grace period, runs in a thread;
* where inotify does not exist (:data:`libc` is None) or fails (the
  per-user limits), nothing raises: ``live`` or :meth:`Watcher.add` say so
  and the caller polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import struct
import sys
import threading
import weakref

import anyio.to_thread

from . import _fork

__all__ = ["LockFileSignals", "Signal", "Watcher", "Watching", "libc", "watchers"]

_IN_CLOSE_WRITE = 0x00000008
_IN_CLOSE_NOWRITE = 0x00000010
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_DONT_FOLLOW = 0x02000000
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


class _Libc:
    """The two libc calls we need; os.read and os.close do the rest."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(None, use_errno=True)
        self._init1 = lib.inotify_init1
        self._init1.argtypes = [ctypes.c_int]
        self._init1.restype = ctypes.c_int
        self._add = lib.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._add.restype = ctypes.c_int

    def init(self) -> int:
        fd = int(self._init1(os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return fd

    def add_watch(self, fd: int, path: str, mask: int) -> int:
        wd = int(self._add(fd, os.fsencode(path), mask))
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return wd


def _load() -> _Libc | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return _Libc()
    except (OSError, AttributeError):
        return None


#: None where inotify does not exist: campaigns then poll every ``poll_interval``.
libc: _Libc | None = _load()


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class Signal:
    """A change notice: :meth:`fire` sets the current ``event`` and replaces it.

    A waiter reads ``event`` *before* looking at the lock, so a change after its look is never missed.
    """

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def fire(self) -> None:
        event, self.event = self.event, asyncio.Event()
        event.set()


class LockFileSignals:
    """The signals of one lock file: ``closed`` when anyone closed it (a release, a crash, a
    cancelled campaign), ``left`` when a waiter closed its ``.waiting`` descriptor (it won, or gave up)."""

    __slots__ = ("closed", "left")

    def __init__(self) -> None:
        self.closed = Signal()
        self.left = Signal()


class Watcher:
    """One inotify instance per event loop, for every lock file its electors campaign on.

    It lives while an elector of the loop that has campaigned is open: closing
    an inotify instance waits for a kernel grace period, long enough to slow a
    handover, so it is not closed after every campaign. ``live`` is False when
    inotify is not available or failed: campaigns then poll.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.users: weakref.WeakSet[Watching] = weakref.WeakSet()
        self.fd = -1
        self.error: str | None = None
        self._channels: dict[str, LockFileSignals] = {}
        self._signals: dict[int, Signal] = {}
        if libc is None:
            self.error = "inotify is not available on this platform"
            return
        try:
            self.fd = libc.init()
        except OSError as exc:  # EMFILE: the per-user limit of inotify instances (128 by default)
            self.error = f"inotify_init1 failed: {exc.strerror}"
            return
        try:
            loop.add_reader(self.fd, self._on_readable)
        except (OSError, NotImplementedError, RuntimeError) as exc:
            self.error = f"cannot register inotify with the event loop: {exc!r}"
            os.close(self.fd)
            self.fd = -1

    @property
    def live(self) -> bool:
        return self.fd >= 0

    def channel(self, path: str) -> LockFileSignals:
        channel = self._channels.get(path)
        if channel is None:
            channel = self._channels[path] = LockFileSignals()
        return channel

    def add(self, path: str) -> int:
        """Start watching every close of ``path``'s current inode; its watch descriptor, -1 (poll) if that fails.

        Idempotent per inode; a symbolic link at ``path`` is not followed. A path
        lookup: called in a worker thread, before the first try, and followed by
        :meth:`register` on the loop. A close between the two is not reported, but
        it happened before our first try, which sees its effect.
        """
        fd = self.fd
        if fd < 0 or libc is None:
            return -1
        try:
            return libc.add_watch(fd, path, _IN_CLOSE_WRITE | _IN_CLOSE_NOWRITE | _IN_DONT_FOLLOW)
        except OSError as exc:  # ENOSPC: the per-user limit of watches
            self.error = f"inotify_add_watch failed: {exc.strerror}"
            return -1

    def register(self, wd: int, signal: Signal) -> bool:
        """Fire ``signal`` on the events of watch ``wd`` (from :meth:`add`); False (poll) if there is none."""
        if wd < 0 or self.fd < 0:
            return False
        self._signals[wd] = signal
        return True

    def _on_readable(self) -> None:
        fired: set[int] = set()
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                break
            except OSError as exc:  # never expected: wake everyone; they poll from here on
                self.error = f"reading inotify events failed: {exc!r}"
                self.close()
                for channel in self._channels.values():
                    channel.closed.fire()
                    channel.left.fire()
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                if mask & _IN_Q_OVERFLOW:
                    targets = [s for c in self._channels.values() for s in (c.closed, c.left)]
                elif mask & _IN_IGNORED:  # the inode is gone
                    self._signals.pop(wd, None)
                    continue
                else:
                    signal = self._signals.get(wd)
                    targets = [signal] if signal is not None else []
                for target in targets:
                    if id(target) not in fired:
                        fired.add(id(target))
                        target.fire()

    def close(self) -> int:
        """Unregister from the loop; return the descriptor, for the caller to close off the loop."""
        fd, self.fd = self.fd, -1
        if fd >= 0 and not self.loop.is_closed():
            with contextlib.suppress(Exception):
                self.loop.remove_reader(fd)
        return fd

    def forget(self) -> None:
        """In a forked child: close our copy without touching the (shared) event loop registration."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            _close(fd)


#: The watcher of each running event loop, by id(loop).
watchers: dict[int, Watcher] = {}


def _forget_watchers() -> None:
    for watcher in list(watchers.values()):
        watcher.forget()
    watchers.clear()


_fork.on_fork(_forget_watchers)


def close_later(fd: int) -> None:
    """Close an inotify descriptor in a thread of its own: the close waits for a kernel grace period."""
    if fd >= 0:
        threading.Thread(target=_close, args=(fd,), name="aioelect-inotify-close", daemon=True).start()


class Watching:
    """One backend's use of the watcher of the loop it campaigns on: from :meth:`get` until :meth:`drop`.

    The watcher of a loop lives while one of its users does; the last user to
    drop it (or be garbage-collected) lets it close.
    """

    def __init__(self) -> None:
        self.watcher: Watcher | None = None

    def get(self) -> Watcher:
        """The running loop's watcher, kept for this user until :meth:`drop`."""
        loop = asyncio.get_running_loop()
        for key, other in list(watchers.items()):
            if other.loop.is_closed():  # a loop that ended with electors left open
                del watchers[key]
                close_later(other.close())
        watcher = watchers.get(id(loop))
        if watcher is None or watcher.loop is not loop:
            watcher = watchers[id(loop)] = Watcher(loop)
        previous = self.watcher
        if previous is not watcher:
            if previous is not None:
                close_later(self.drop())
            self.watcher = watcher
            watcher.users.add(self)
        return watcher

    def drop(self) -> int:
        """Give the watcher up; its descriptor if we were its last user (to close off the loop), else -1."""
        watcher, self.watcher = self.watcher, None
        if watcher is None:
            return -1
        watcher.users.discard(self)
        if watcher.users:
            return -1
        if watchers.get(id(watcher.loop)) is watcher:
            del watchers[id(watcher.loop)]
        return watcher.close()

    async def aclose(self) -> None:
        """:meth:`drop`, and close the watcher's descriptor in a worker thread if we were its last user."""
        fd = self.drop()
        if fd >= 0:
            await anyio.to_thread.run_sync(_close, fd)  # waits for a kernel grace period: off the loop
