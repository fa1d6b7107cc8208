"""Single-host backend: an exclusive ``flock`` on a lock file.

For candidates on **one host only**: ``flock`` locks are kept by the local
kernel, so they do not exclude processes on other machines (NFS, SMB and
other network file systems are not supported, whatever their lock emulation
does). No extra dependency.

* The lock file is ``path`` itself; ``name`` is only a label (logs and the
  sidecar). Use one lock file per election. The file is created if missing
  and never deleted: deleting or replacing it while candidates run breaks
  mutual exclusion until the leader's next check (``check_interval``).
* Leadership is ``flock(LOCK_EX)`` on a file descriptor of our own, so two
  electors in one process exclude each other too (unlike ``lockf``/``fcntl``
  locks, which belong to the whole process). The kernel drops the lock the
  moment the holding process dies.
* **Waking followers.** The kernel cannot tell an asyncio task that a
  ``flock`` became free, and a blocking ``flock`` in a worker thread cannot
  be cancelled safely. But a lock is freed by closing the file: our release
  unlocks, then closes; a dying process's files are closed by the kernel.
  Every close of the lock file raises an inotify ``IN_CLOSE_NOWRITE`` event
  (measured: 1-2 ms after a SIGKILL, for a descriptor opened read-only), so
  on Linux followers watch the lock file with inotify (through ctypes; one
  inotify instance per event loop, its descriptor registered with the loop,
  shared by the electors of that loop and kept until they are closed) and
  try ``LOCK_EX | LOCK_NB`` only when a close happened:
  takeover within milliseconds of a release or a crash, and nothing to do
  while the leader lives. The kernel queues the event just *before* it drops
  a dying holder's lock, so a try that fails right after an event is made
  again :data:`_RECHECK` later. Closes that inotify cannot see (a forked
  process still sharing the holder's descriptor, a foreign program that
  unlocks without closing) are caught by a fallback try every
  ``max(poll_interval, 1 s)``. Where inotify is unavailable (not Linux, or
  the per-user inotify limits are reached) followers try every
  ``poll_interval`` (50 ms by default), as before.
* **Handing over.** A leader that releases and campaigns again at once would
  find the lock free before any follower woke up and win again, every time.
  So waiting candidates announce themselves with a *shared* ``flock`` on
  ``path + ".waiting"`` (dropped by the kernel if they die). A candidate
  that starts campaigning first tries ``LOCK_EX | LOCK_NB`` on that file,
  which fails only if someone else waits; if so, it stays out of the race
  until one of the waiters has left the queue (it closes its ``.waiting``
  descriptor the moment it wins, which inotify reports) or, at most,
  ``min(2 * poll_interval, 0.25 s)`` (a frozen or very slow waiter), then
  tries. A release therefore goes to a waiting follower, and the releaser
  waits its turn like everyone else. The bound keeps a stuck waiter from
  keeping the lock free for long.
* After locking, the leader writes its identity and a token (the previous
  token + 1) to the sidecar ``path + ".leader"`` (JSON, replaced atomically by
  rename): :meth:`~aioelect.Elector.leader` reads it, after checking with a
  non-blocking shared lock that someone actually holds the lock. That check
  runs on a descriptor kept open until ``aclose()``, so that observers do not
  wake the followers (only closes do).
* The kernel never takes a ``flock`` from a live process, so there is no
  renew deadline: a leader only loses leadership if the lock file is deleted
  or replaced (checked every ``check_interval``). A frozen (SIGSTOPped)
  leader therefore keeps leadership until it is resumed or killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import secrets
import socket
import stat
import struct
import sys
import threading
import time
import weakref
from typing import Any

import anyio
import anyio.to_thread

from .._backend import Backend, Backoff, Confirm, Hold, monotonic, until_recorded
from .._config import positive, validate_name
from .._elector import Elector
from .._errors import BackendUnavailable, ElectionError

__all__ = ["FileElector", "SIDECAR_SUFFIX", "WAITING_SUFFIX"]

#: The sidecar holding the leader's identity and token is ``path + SIDECAR_SUFFIX``.
SIDECAR_SUFFIX = ".leader"
#: Waiting candidates hold a shared ``flock`` on ``path + WAITING_SUFFIX``.
WAITING_SUFFIX = ".waiting"

# Errors that no retry can fix: the directory or file is missing, not ours, or read-only.
_PERMANENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EROFS, errno.ELOOP}

#: With inotify, how long after an event whose try failed to try once more: the kernel
#: reports a dying holder's close just before it drops the lock.
_RECHECK = 0.005
#: With inotify, the slowest followers ever retry without an event (closes inotify cannot see).
_FALLBACK = 1.0
#: Upper bound on how long a new campaign lets announced waiters go first.
_MAX_HANDOVER = 0.25


# --- inotify, through ctypes ---------------------------------------------------------------

_IN_CLOSE_WRITE = 0x00000008
_IN_CLOSE_NOWRITE = 0x00000010
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name


class _Inotify:
    """The two libc calls we need; os.read and os.close do the rest."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._init1 = libc.inotify_init1
        self._init1.argtypes = [ctypes.c_int]
        self._init1.restype = ctypes.c_int
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._add.restype = ctypes.c_int

    def init(self) -> int:
        fd = int(self._init1(_IN_NONBLOCK | _IN_CLOEXEC))
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


def _load_inotify() -> _Inotify | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return _Inotify()
    except (OSError, AttributeError):
        return None


#: None where inotify does not exist: followers then poll every ``poll_interval``.
_inotify: _Inotify | None = _load_inotify()


class _Signal:
    """A change notice: :meth:`fire` sets the current ``event`` and replaces it.

    A waiter reads ``event`` *before* looking at the lock, so a change after its look is never missed.
    """

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def fire(self) -> None:
        event, self.event = self.event, asyncio.Event()
        event.set()


class _Channel:
    """The signals of one lock file: ``closed`` when anyone closed it (a release, a crash, a
    cancelled campaign), ``left`` when a waiter closed its ``.waiting`` descriptor (it won, or gave up)."""

    __slots__ = ("closed", "left")

    def __init__(self) -> None:
        self.closed = _Signal()
        self.left = _Signal()


class _Watcher:
    """One inotify instance per event loop, for every lock file its electors campaign on.

    It lives while an elector of the loop that has campaigned is open: closing
    an inotify instance waits for a kernel grace period (measured: up to 15 ms,
    in the middle of a handover), so it is not closed after every campaign.
    ``live`` is False when inotify is not available or failed: campaigns then poll.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.users: weakref.WeakSet[_FileBackend] = weakref.WeakSet()
        self.fd = -1
        self.error: str | None = None
        self._channels: dict[str, _Channel] = {}
        self._signals: dict[int, _Signal] = {}
        if _inotify is None:
            self.error = "inotify is not available on this platform"
            return
        try:
            self.fd = _inotify.init()
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

    def channel(self, path: str) -> _Channel:
        channel = self._channels.get(path)
        if channel is None:
            channel = self._channels[path] = _Channel()
        return channel

    def watch(self, path: str, signal: _Signal) -> bool:
        """Fire ``signal`` on every close of ``path``'s current inode; False (poll) if that fails.

        Idempotent per inode. Called before the first try, so no close after it is missed.
        """
        if self.fd < 0 or _inotify is None:
            return False
        try:
            wd = _inotify.add_watch(self.fd, path, _IN_CLOSE_WRITE | _IN_CLOSE_NOWRITE)
        except OSError as exc:  # ENOSPC: the per-user limit of watches
            self.error = f"inotify_add_watch failed: {exc.strerror}"
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
            with contextlib.suppress(OSError):
                os.close(fd)


#: The watcher of each running event loop, by id(loop).
_watchers: dict[int, _Watcher] = {}


def _close_later(fd: int) -> None:
    """Close an inotify descriptor in a thread of its own: the close waits for a kernel grace period."""
    if fd >= 0:
        threading.Thread(target=_close, args=(fd,), name="aioelect-inotify-close", daemon=True).start()


def _watcher(backend: _FileBackend) -> _Watcher:
    """The running loop's watcher, kept for ``backend`` until it is closed (:func:`_unwatch`)."""
    loop = asyncio.get_running_loop()
    for key, other in list(_watchers.items()):
        if other.loop.is_closed():  # a loop that ended with electors left open
            del _watchers[key]
            _close_later(other.close())
    watcher = _watchers.get(id(loop))
    if watcher is None or watcher.loop is not loop:
        watcher = _watchers[id(loop)] = _Watcher(loop)
    previous = backend.watcher
    if previous is not watcher:
        if previous is not None:
            _close_later(_unwatch(backend))
        backend.watcher = watcher
        watcher.users.add(backend)
    return watcher


def _unwatch(backend: _FileBackend) -> int:
    """Drop ``backend``'s use of its watcher; return the descriptor to close if it was the last user."""
    watcher, backend.watcher = backend.watcher, None
    if watcher is None:
        return -1
    watcher.users.discard(backend)
    if watcher.users:
        return -1
    if _watchers.get(id(watcher.loop)) is watcher:
        del _watchers[id(watcher.loop)]
    return watcher.close()


# --- fork safety ---------------------------------------------------------------------------

# Holds and campaigns alive in this process: a forked child closes its inherited copies,
# so that a child that outlives them neither keeps the lock nor stays announced as waiting.
_live_holds: weakref.WeakSet[_FileHold] = weakref.WeakSet()
_live_attempts: weakref.WeakSet[_Attempt] = weakref.WeakSet()


def _close_in_child() -> None:
    for hold in list(_live_holds):
        hold._forget()
    _live_holds.clear()
    for attempt in list(_live_attempts):
        attempt.forget()
    _live_attempts.clear()
    for watcher in list(_watchers.values()):
        watcher.forget()
    _watchers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def _same_file(fd: int, path: str) -> bool:
    """True if ``path`` still names the file open on ``fd``."""
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (at_path.st_dev, at_path.st_ino) == (mine.st_dev, mine.st_ino)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class _Attempt:
    """The descriptors of one campaign: the lock file, and our place in the ``.waiting`` queue."""

    def __init__(self) -> None:
        self.lock_fd = -1
        self.waiting_fd = -1
        self.announced = False
        _live_attempts.add(self)

    def take_lock_fd(self) -> int:
        fd, self.lock_fd = self.lock_fd, -1
        return fd

    def leave_queue(self) -> None:
        """Close our ``.waiting`` descriptor: drops our shared lock, and tells deferring campaigns."""
        fd, self.waiting_fd = self.waiting_fd, -1
        self.announced = False
        if fd >= 0:
            _close(fd)

    def close(self) -> None:
        _live_attempts.discard(self)
        self.leave_queue()
        fd = self.take_lock_fd()
        if fd >= 0:
            _close(fd)  # closing drops a lock we may already hold

    def forget(self) -> None:
        """In a forked child: close our copies; the parent's locks stay (they belong to the shared file)."""
        for fd in (self.lock_fd, self.waiting_fd):
            if fd >= 0:
                _close(fd)
        self.lock_fd = self.waiting_fd = -1
        self.announced = False


class _FileHold(Hold):
    def __init__(self, backend: _FileBackend, fd: int, token: int, acquired_at: float) -> None:
        self._backend = backend
        self._fd = fd
        self.token = token
        self.acquired_at = acquired_at
        _live_holds.add(self)

    async def monitor(self, confirm: Confirm) -> str:
        b = self._backend
        while True:
            await anyio.sleep(b.check_interval)
            sent = monotonic()
            if self._fd < 0:
                return "lock file descriptor was closed"
            try:
                same = _same_file(self._fd, b.path)
            except OSError as exc:
                return f"lock file check failed: {exc!r}"
            if not same:
                return f"lock file {b.path} was deleted or replaced"
            confirm(sent)

    async def release(self) -> None:
        fd, self._fd = self._fd, -1
        _live_holds.discard(self)
        if fd < 0:
            return
        try:
            # Unlock before closing: the close is what wakes the followers (inotify), and
            # their try must then find the lock free.
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            self._backend.log.debug("unlock failed (%r); closing the file drops the lock", exc)
        finally:
            os.close(fd)

    def _forget(self) -> None:
        """In a forked child: close our copy of the descriptor without unlocking the parent's lock."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class _FileBackend(Backend):
    kind = "file"

    def __init__(self, *, path: str, name: str, poll_interval: float, check_interval: float) -> None:
        super().__init__(name)
        self.path = path
        self.sidecar = path + SIDECAR_SUFFIX
        self.waiting = path + WAITING_SUFFIX
        self.poll_interval = poll_interval
        self.observe_interval = max(poll_interval, 0.1)
        self.check_interval = check_interval
        #: With inotify, the retry interval without events.
        self.fallback = max(poll_interval, _FALLBACK)
        #: How long a new campaign lets announced waiters go first, at most.
        self.handover = min(2 * poll_interval, _MAX_HANDOVER)
        self._polling_logged = False
        self._queue_logged = False
        #: This loop's inotify watcher, once we campaigned; given up by aclose().
        self.watcher: _Watcher | None = None
        #: The descriptor leader() probes the lock on, once it was called; closed by aclose().
        self._probe_fd = -1

    def describe_timing(self) -> str:
        how = (
            f"followers wake on the lock file's close (inotify; retry every {self.fallback:g}s without one), "
            f"or try every {self.poll_interval:g}s where inotify is unavailable"
        )
        return (
            f"lock file {self.path}, poll_interval={self.poll_interval:g}s check_interval={self.check_interval:g}s: "
            f"{how}; a new campaign lets waiting candidates go first for up to {self.handover:g}s; nothing to renew "
            "(the kernel keeps the lock while the leader's process lives, even frozen)"
        )

    # --- campaign ----------------------------------------------------------------

    def _open(self) -> int:
        try:
            # Read access is all flock needs, so candidates of other users may share a lock file.
            return os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno in _PERMANENT_ERRNOS:
                raise ElectionError(f"cannot open lock file {self.path}: {exc.strerror}") from None
            raise

    def _announce(self, attempt: _Attempt, watcher: _Watcher, channel: _Channel) -> asyncio.Event | None:
        """Join the ``.waiting`` queue; if other candidates were waiting already, return the
        event that fires when one of them leaves it (None: nobody waits, or no queue).

        The queue only orders turns, it never guards anything: if it cannot be
        used (permissions) campaigns go on without it.
        """
        try:
            fd = os.open(self.waiting, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if not self._queue_logged:
                self._queue_logged = True
                self.log.info("cannot open %s (%s): a releaser may win again over waiters", self.waiting, exc.strerror)
            return None
        attempt.waiting_fd = fd
        # Watched and read before looking, so that a waiter leaving after our look is not missed.
        watched = watcher.watch(self.waiting, channel.left)
        left = channel.left.event
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # succeeds only if nobody holds it shared
            others = False
        except BlockingIOError:
            others = True
        self._rejoin(attempt)
        if not others:
            return None
        # Without inotify nobody tells us when a waiter leaves: an event that never fires.
        return left if watched else asyncio.Event()

    @staticmethod
    def _rejoin(attempt: _Attempt) -> None:
        """Hold the ``.waiting`` lock shared (converting our probe's exclusive lock, if any)."""
        if attempt.waiting_fd < 0:
            return
        try:
            fcntl.flock(attempt.waiting_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            attempt.announced = True
        except BlockingIOError:
            # Another newcomer's probe holds it exclusively for an instant: try again after our next try.
            attempt.announced = False

    async def _lock(self, attempt: _Attempt) -> float:
        """Take the lock on a fresh descriptor of ``path``; return when the winning try was sent."""
        watcher = _watcher(self)
        channel = watcher.channel(self.path)
        attempt.lock_fd = self._open()
        events = watcher.watch(self.path, channel.closed)
        if not events and not self._polling_logged:
            self._polling_logged = True
            self.log.info("followers poll every %gs: %s", self.poll_interval, watcher.error or "no inotify")
        left = self._announce(attempt, watcher, channel)
        if left is not None:
            # Let a waiter take this turn: until one leaves the queue (it won, or gave up), bounded.
            started = monotonic()
            with anyio.move_on_after(self.handover):
                await left.wait()
            self.log.debug("let waiting candidates go first for %.1f ms", (monotonic() - started) * 1000)
        woken = False
        while True:
            closed = channel.closed.event  # read before trying: a close after the try wakes us
            sent = monotonic()
            if attempt.lock_fd < 0:  # closed under us by a fork
                raise OSError(errno.EBADF, "lock file descriptor was closed")
            try:
                fcntl.flock(attempt.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                attempt.leave_queue()
                return sent
            if not attempt.announced:
                self._rejoin(attempt)
            if events and watcher.live:
                # Right after an event, once more soon: a dying holder's close is reported
                # just before its lock is dropped.
                with anyio.move_on_after(_RECHECK if woken else self.fallback) as scope:
                    await closed.wait()
                woken = not scope.cancelled_caught
            else:
                await anyio.sleep(self.poll_interval)

    async def campaign(self, identity: str) -> Hold:
        backoff = Backoff(first=0.05, maximum=1.0)
        while True:
            attempt = _Attempt()
            try:
                sent = await self._lock(attempt)
                # The file may have been replaced between our open and our lock: a lock on
                # an inode nobody else opens any more guards nothing, so start over.
                if not _same_file(attempt.lock_fd, self.path):
                    self.log.debug("lock file was replaced while locking; opening it again")
                    continue
                token = await anyio.to_thread.run_sync(self._record, identity)
                return _FileHold(self, attempt.take_lock_fd(), token, sent)
            except ElectionError:
                raise
            except OSError as exc:
                if exc.errno in _PERMANENT_ERRNOS:
                    raise ElectionError(f"lock file {self.path}: {exc.strerror}") from None
                delay = backoff.next_delay()
                self.report_error(f"campaign interrupted ({exc!r})", delay)
                attempt.close()
                await anyio.sleep(delay)
            finally:
                attempt.close()

    def _read(self) -> dict[str, Any] | None:
        """The sidecar's content, None if there is none; ElectionError if it is not ours."""
        try:
            with open(self.sidecar, "rb") as fh:
                raw = fh.read(64 * 1024)
        except FileNotFoundError:
            return None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or not isinstance(data.get("token"), int):
                raise ValueError("no token")
        except ValueError:
            raise ElectionError(
                f"{self.sidecar} is not an aioelect leader file; move it away (tokens restart from 1)"
            ) from None
        return data

    def _record(self, identity: str) -> int:
        """Write identity and the next token to the sidecar, atomically; return the token.

        Runs only while we hold the lock, so no other candidate writes concurrently.
        """
        previous = self._read()
        token = int(previous["token"]) + 1 if previous else 1
        data = {
            "identity": identity,
            "token": token,
            "name": self.name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "acquired_at": time.time(),
        }
        tmp = f"{self.sidecar}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                os.write(fd, json.dumps(data).encode() + b"\n")
                os.fsync(fd)  # so that the token survives a host crash and never goes backwards
            finally:
                os.close(fd)
            os.replace(tmp, self.sidecar)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        try:
            dir_fd = os.open(os.path.dirname(self.path), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass  # best effort: the rename itself is atomic
        return token

    async def aclose(self) -> None:
        probe, self._probe_fd = self._probe_fd, -1
        if probe >= 0:
            _close(probe)
        fd = _unwatch(self)
        if fd >= 0:
            await anyio.to_thread.run_sync(_close, fd)  # waits for a kernel grace period: off the loop

    # --- who leads -----------------------------------------------------------------

    def _locked(self) -> bool:
        """True if someone holds the lock: a shared lock cannot be taken without blocking.

        Probes on a descriptor kept open (reopened if the file was replaced): a close
        would wake every waiting follower for nothing. A follower whose try meets our
        probe's instant shared lock tries again :data:`_RECHECK` later.
        """
        fd = self._probe_fd
        if fd >= 0 and not _same_file(fd, self.path):
            self._probe_fd = -1
            os.close(fd)
            fd = -1
        if fd < 0:
            try:
                fd = self._probe_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False

    async def leader(self) -> str | None:
        async def look() -> tuple[bool, str | None]:
            await anyio.lowlevel.checkpoint()
            try:
                if not self._locked():
                    return False, None
                data = self._read()
            except OSError as exc:
                raise BackendUnavailable(f"cannot read lock file {self.path}: {exc.strerror or exc!r}") from None
            identity = data.get("identity") if data is not None else None
            return True, identity if isinstance(identity, str) else None

        # Only the first leader of a lock file is ever without a record.
        locked, identity = await until_recorded(look, lambda seen: not seen[0] or seen[1] is not None)
        if not locked:
            return None
        return identity if identity is not None else f"unknown holder of {self.path}"


class FileElector(Elector):
    """A candidate in a single-host election on an exclusive ``flock``.

    Guarantees (beyond :class:`~aioelect.Elector`'s):

    * mutual exclusion between processes (and electors) **on one host**
      that use the same lock file ``path`` on a local file system (not NFS);
    * on Linux, a follower takes over within milliseconds of a release and
      of the leader's process dying for any reason (the kernel drops the
      lock and inotify reports the close), and a waiting follower costs
      nothing but one try per ``max(poll_interval, 1 s)``; where inotify is
      unavailable, followers try every ``poll_interval`` and take over within it;
    * a candidate that starts campaigning while others wait (a leader that
      released and campaigns again, or a newcomer) lets one of them take the
      lock first: it stays out until a waiter leaves the queue, at most
      ``min(2 * poll_interval, 0.25 s)``;
    * each leadership gets a token one higher than the previous one for this
      lock file (kept in ``path + ".leader"`` with the identity, fsynced);
    * a leader loses leadership only if the lock file is deleted or replaced,
      noticed within ``check_interval``; there is no renew deadline, and a
      frozen leader keeps leadership until it resumes or dies.

    ``name`` is only a label for logs and the sidecar. Besides the lock file,
    ``path + ".leader"`` and ``path + ".waiting"`` are created next to it and
    never deleted. A waiting candidate holds two descriptors (the lock file,
    ``.waiting``), and each event loop with waiting candidates one inotify
    instance per lock file. Raises ValueError at construction if ``path``'s
    directory does not exist, cannot be reached, is not a directory or is
    not writable (the sidecar is replaced there), if ``path`` is a
    directory, or if an existing lock file is not readable. The same
    conditions arising later (directory removed, permissions changed) raise
    :class:`~aioelect.ElectionError` from :meth:`acquire`, at once.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str = "aioelect/leader",
        identity: str | None = None,
        poll_interval: float = 0.05,
        check_interval: float = 1.0,
        stop_timeout: float = 5.0,
    ) -> None:
        try:
            text = os.fspath(path)
        except TypeError:
            raise ValueError(f"path must be a file path, not {path!r}") from None
        if not isinstance(text, str) or not text:
            raise ValueError("path must be a non-empty file path")
        full = os.path.abspath(os.path.expanduser(text))
        directory = os.path.dirname(full)
        try:
            is_dir = stat.S_ISDIR(os.stat(directory).st_mode)
        except FileNotFoundError:
            raise ValueError(f"directory {directory} of lock file {full} does not exist") from None
        except NotADirectoryError:
            is_dir = False
        except PermissionError:
            raise ValueError(f"directory {directory} of lock file {full}: permission denied") from None
        if not is_dir:
            raise ValueError(f"{directory} (the lock file's directory) is not a directory")
        if os.path.isdir(full):
            raise ValueError(f"{full} is a directory; path must name the lock file")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ValueError(
                f"directory {directory} is not writable: the lock file and its {SIDECAR_SUFFIX} sidecar live there"
            )
        if os.path.exists(full) and not os.access(full, os.R_OK):
            raise ValueError(f"lock file {full} is not readable")
        backend = _FileBackend(
            path=full,
            name=validate_name(name),
            poll_interval=positive("poll_interval", poll_interval, maximum=60),
            check_interval=positive("check_interval", check_interval, maximum=3600),
        )
        super().__init__(backend, identity=identity, stop_timeout=stop_timeout)
        self._file = backend

    @property
    def path(self) -> str:
        """The absolute path of the lock file."""
        return self._file.path

    @property
    def sidecar(self) -> str:
        """The JSON file with the leader's ``identity``, ``token``, ``pid``, ``host`` and ``acquired_at``."""
        return self._file.sidecar
