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
* After locking, the leader keeps the new token (one more than the larger
  of the lock file's and the sidecar's) in the lock file itself, rewritten
  in place, and writes its identity and the token to the sidecar
  ``path + ".leader"`` (JSON, replaced atomically by rename); both fsynced.
  Deleting one of the two files (a tmp cleaner) does not make tokens start
  again. :meth:`~aioelect.Elector.leader` reads the sidecar, after checking
  with a non-blocking shared lock that someone actually holds the lock. That
  check runs on a descriptor kept open until ``aclose()``, so that observers
  do not wake the followers (only closes do).
* **Other users.** A ``flock`` needs only read access, so whoever may open
  the lock file may hold the lock forever. Files are created with ``mode``
  (0600 by default, set exactly, whatever the umask); every open uses
  ``O_NOFOLLOW`` (a symbolic link at a path is refused) and ``O_NONBLOCK``
  (a FIFO at a path cannot block the open), and what was opened must be a
  regular file owned by this user (or, with ``mode=0o660``, by a user of one
  of our groups): anything else is a clear :class:`~aioelect.ElectionError`,
  never a wait. The sidecar is read up to 64 KiB, whatever its size says.
  A directory every user may write to without the sticky bit is refused, and
  so is one owned by another user than ours or root (with ``mode=0o660``:
  unless it belongs to one of our groups).
* **The event loop never waits for the disk.** Opening, reading, writing,
  renaming and fsyncing run in worker threads; on the loop run only calls
  on descriptors already open that cannot block (``flock`` with
  ``LOCK_NB``, ``fstat``, ``close``) and the reads of the inotify descriptor.
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
import pwd
import re
import secrets
import socket
import stat
import struct
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, TypedDict

import anyio
import anyio.to_thread

from .._backend import Backend, Backoff, Confirm, Hold, monotonic, until_recorded
from .._config import DEFAULT_NAME, check_options, positive, validate_name
from .._errors import BackendUnavailable, ElectionError

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["DEFAULT_MODE", "FileBackend", "FileOptions", "SIDECAR_SUFFIX", "WAITING_SUFFIX"]

#: The sidecar holding the leader's identity and token is ``path + SIDECAR_SUFFIX``.
SIDECAR_SUFFIX = ".leader"
#: Waiting candidates hold a shared ``flock`` on ``path + WAITING_SUFFIX``.
WAITING_SUFFIX = ".waiting"

#: The files are created for their owner only unless ``mode=`` says otherwise.
DEFAULT_MODE = 0o600
#: The modes ``mode=`` accepts: the owner reads and writes, and so may a group. Nothing between: read
#: access alone is enough to hold a ``flock``. Other users never get access (any of them could hold the
#: lock forever).
_MODES = (0o600, 0o660)

# Errors that no retry can fix: the directory or file is missing, not ours, or read-only.
_PERMANENT_ERRNOS = {
    errno.EACCES,
    errno.EPERM,
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EROFS,
    errno.ELOOP,
    errno.ENXIO,
    errno.ENODEV,
}

#: Every open: never through a symbolic link at the path, never waiting for a FIFO's other end.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
#: The sidecar is read up to this size; a larger one is refused, whatever its st_size says.
_SIDECAR_LIMIT = 64 * 1024
#: The lock file holds the last token, fixed width so that it is rewritten in place.
_TOKEN_RECORD = b"aioelect-token %019d\n"
_TOKEN_PATTERN = re.compile(rb"aioelect-token (\d{1,19})\n")

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
_IN_DONT_FOLLOW = 0x02000000
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
        self.users: weakref.WeakSet[FileBackend] = weakref.WeakSet()
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

    def add(self, path: str) -> int:
        """Start watching every close of ``path``'s current inode; its watch descriptor, -1 (poll) if that fails.

        Idempotent per inode; a symbolic link at ``path`` is not followed. A path
        lookup: called in a worker thread, before the first try, and followed by
        :meth:`register` on the loop. A close between the two is not reported, but
        it happened before our first try, which sees its effect.
        """
        fd = self.fd
        if fd < 0 or _inotify is None:
            return -1
        try:
            return _inotify.add_watch(fd, path, _IN_CLOSE_WRITE | _IN_CLOSE_NOWRITE | _IN_DONT_FOLLOW)
        except OSError as exc:  # ENOSPC: the per-user limit of watches
            self.error = f"inotify_add_watch failed: {exc.strerror}"
            return -1

    def register(self, wd: int, signal: _Signal) -> bool:
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
            with contextlib.suppress(OSError):
                os.close(fd)


#: The watcher of each running event loop, by id(loop).
_watchers: dict[int, _Watcher] = {}


def _close_later(fd: int) -> None:
    """Close an inotify descriptor in a thread of its own: the close waits for a kernel grace period."""
    if fd >= 0:
        threading.Thread(target=_close, args=(fd,), name="aioelect-inotify-close", daemon=True).start()


def _watcher(backend: FileBackend) -> _Watcher:
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


def _unwatch(backend: FileBackend) -> int:
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


def _at_path(path: str) -> os.stat_result | None:
    """What ``path`` itself names (a symbolic link is not followed), None if nothing; a path lookup."""
    try:
        return os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _same_file(fd: int, path: str) -> bool:
    """True if ``path`` still names the file open on ``fd`` (not a symbolic link to it)."""
    at_path = _at_path(path)
    return at_path is not None and _same(at_path, os.fstat(fd))


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _user(uid: int) -> str:
    """``name (uid N)`` for messages; reads the user database: call off the event loop."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    )
    return next((name for test, name in kinds if test(mode)), "of an unknown type")


def _directory_problem(directory: str, mode: int) -> str | None:
    """Why ``directory`` cannot hold an election's files safely, or None.

    Whoever may rename files in it can move the lock file away while it is
    held, and candidates locking a new one would lead beside the old leader
    until its next check. Refused therefore: a directory every user may write
    to without the sticky bit (with it, as /tmp has, others may only add
    files, which the owner checks refuse), and a directory owned by another
    user than this process's or root, unless ``mode`` shares the election
    with a group and the directory belongs to one of our groups. A path
    lookup: call it off the event loop.
    """
    st = os.stat(directory)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return (
            f"directory {directory} may be written by every user and is not sticky: any of them could replace "
            "the lock file and let two candidates lead at once; use a directory of your own, or remove write "
            "access for others (chmod o-w), or set the sticky bit as /tmp has (chmod +t)"
        )
    if st.st_uid not in (os.geteuid(), 0):
        shared = mode & 0o070 and st.st_gid in {os.getegid(), *os.getgroups()}
        if not shared:
            return (
                f"directory {directory} is owned by {_user(st.st_uid)}, not by this process's user "
                f"{_user(os.geteuid())} or root: its owner could replace the lock file and let two candidates "
                "lead at once; use a directory of your own (for a group of users: one of that group, with "
                "mode=0o660)"
            )
    return None


def _read_bounded(fd: int, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``fd`` from its start, None if there are more (st_size is not trusted)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.pread(fd, limit + 1 - size, size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    return None


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
    def __init__(self, backend: FileBackend, fd: int, token: int, acquired_at: float) -> None:
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
            try:
                at_path = await anyio.to_thread.run_sync(_at_path, b.path)  # a path lookup: off the loop
                if self._fd < 0:
                    return "lock file descriptor was closed"
                mine = os.fstat(self._fd)  # on the loop: the descriptor is closed only here, by release()
            except OSError as exc:
                return f"lock file check failed: {exc!r}"
            if at_path is None or not _same(at_path, mine):
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


class FileOptions(TypedDict, total=False):
    """The options of a lock-file election; :class:`FileBackend` validates them."""

    #: A label for logs and the sidecar (default ``aioelect/leader``).
    name: str
    #: Seconds between a follower's tries where inotify is unavailable (default 0.05, at most 60).
    poll_interval: float
    #: Seconds between the leader's checks that its lock file is still in place (default 1, at most 3600).
    check_interval: float
    #: The files' mode: ``0o600`` (the default, the owner only) or ``0o660`` (a group's users too).
    mode: int


class FileBackend(Backend):
    """``flock`` elections on one host, built from a lock file path and :class:`FileOptions`.

    The constructor validates every option and looks at the directory
    (``stat``; ValueError for what cannot work); it opens no file.
    """

    kind = "file"

    def __init__(self, path: str | os.PathLike[str], **options: Unpack[FileOptions]) -> None:
        check_options("FileElector", options, FileOptions)
        mode = options.get("mode", DEFAULT_MODE)
        if isinstance(mode, bool) or not isinstance(mode, int) or mode not in _MODES:
            raise ValueError(
                f"mode must be 0o600 (the default: the owner only) or 0o660 (the users of a group too), not "
                f"{mode!r}: whoever may read the lock file can hold the lock forever, so other users never get "
                "access"
            )
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
        problem = _directory_problem(directory, mode)
        if problem is not None:
            raise ValueError(problem)
        if os.path.exists(full) and not os.access(full, os.R_OK | os.W_OK):
            raise ValueError(f"lock file {full} is not readable and writable (the token is kept in it)")
        name = validate_name(options.get("name", DEFAULT_NAME))
        poll_interval = positive("poll_interval", options.get("poll_interval", 0.05), maximum=60)
        super().__init__(name)
        self.path = full
        self.directory = directory
        self.sidecar = full + SIDECAR_SUFFIX
        self.waiting = full + WAITING_SUFFIX
        self.mode = mode
        self.poll_interval = poll_interval
        self.observe_interval = max(poll_interval, 0.1)
        self.check_interval = positive("check_interval", options.get("check_interval", 1.0), maximum=3600)
        #: With inotify, the retry interval without events.
        self.fallback = max(poll_interval, _FALLBACK)
        #: How long a new campaign lets announced waiters go first, at most.
        self.handover = min(2 * poll_interval, _MAX_HANDOVER)
        self._polling_logged = False
        #: This loop's inotify watcher, once we campaigned; given up by aclose().
        self.watcher: _Watcher | None = None
        #: The descriptor leader() probes the lock on, once it was called; closed by aclose().
        self._probe_fd = -1
        #: leader() probes in worker threads: one at a time on the shared descriptor.
        self._probe_lock = threading.Lock()
        if mode != DEFAULT_MODE:
            self.warnings.append(
                f"mode={oct(mode)}: the users of the lock file's group can open it and hold the lock; every one of "
                "them is trusted with this election"
            )

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

    # --- opening files safely (worker threads only: path lookups may block) ------------

    def _open(self, path: str, what: str, *, create: bool, write: bool, fix: bool) -> int:
        """Open ``path``, a regular file this process may trust; ElectionError otherwise.

        Never follows a symbolic link at ``path`` and never waits for a FIFO's
        other end: what is there is looked at first, and checked again on the
        open descriptor (it may have been swapped in between). ``fix``: a file
        of ours whose permissions differ from ``mode`` is set to ``mode``
        (with a warning if it let more users in). FileNotFoundError when
        ``create`` is False and nothing is there.
        """
        before = _at_path(path)
        if before is not None:
            self._check(before, path, what)
        elif not create:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        flags = (os.O_RDWR if write else os.O_RDONLY) | _OPEN_FLAGS | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path, flags, self.mode)
        except FileNotFoundError:
            if create:  # the directory is gone
                raise ElectionError(f"cannot open {what} {path}: {os.strerror(errno.ENOENT)}") from None
            raise
        except OSError as exc:
            raise self._open_error(path, what, exc) from None
        try:
            st = os.fstat(fd)
            self._check(st, path, what)
            bits = stat.S_IMODE(st.st_mode)
            if fix and st.st_uid == os.geteuid() and bits != self.mode:
                os.fchmod(fd, self.mode)  # also what a umask removed from a file we just created
                if bits & ~self.mode:
                    self.log.warning(
                        "%s %s had mode %s, wider than mode=%s: set to %s, so that other users cannot open it "
                        "and hold the lock",
                        what,
                        path,
                        oct(bits),
                        oct(self.mode),
                        oct(self.mode),
                    )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check(self, st: os.stat_result, path: str, what: str) -> None:
        """ElectionError unless ``st`` is a regular file of ours, or of our group when ``mode`` shares it."""
        if not stat.S_ISREG(st.st_mode):
            hint = (
                "aioelect never follows one there (it could point anywhere)"
                if stat.S_ISLNK(st.st_mode)
                else "not a regular file"
            )
            raise ElectionError(f"{what} {path} is {_kind(st.st_mode)}, {hint}: remove it, or choose another path")
        me = os.geteuid()
        if st.st_uid == me:
            return
        bits = stat.S_IMODE(st.st_mode)
        owner = f"{what} {path} is owned by {_user(st.st_uid)}, not by this process's user {_user(me)}"
        if not self.mode & 0o070:
            raise ElectionError(
                f"{owner}: another user may have planted it. Remove it if it is not yours; for an election shared "
                "by the users of a group, give every candidate mode=0o660 and a directory of that group"
            )
        if st.st_gid not in {os.getegid(), *os.getgroups()}:
            raise ElectionError(f"{owner}, and its group (gid {st.st_gid}) is not one of this process's groups")
        if bits & ~self.mode:
            raise ElectionError(f"{owner}, with mode {oct(bits)}: wider than mode={oct(self.mode)}")

    @staticmethod
    def _open_error(path: str, what: str, exc: OSError) -> OSError | ElectionError:
        """The error to raise for a failed open: ElectionError if no retry can fix it."""
        if exc.errno == errno.ELOOP:
            return ElectionError(
                f"{what} {path} is a symbolic link, and aioelect never follows one there (it could point "
                "anywhere): remove it, or choose another path"
            )
        if exc.errno in (errno.EISDIR, errno.ENXIO, errno.ENODEV):
            return ElectionError(f"{what} {path} is not a regular file ({exc.strerror}): remove it")
        if exc.errno in (errno.EACCES, errno.EPERM):
            at_path = _at_path(path)
            who = (
                f" (owned by {_user(at_path.st_uid)}, mode {oct(stat.S_IMODE(at_path.st_mode))})"
                if at_path is not None
                else ""
            )
            return ElectionError(f"cannot open {what} {path}: {exc.strerror}{who}")
        if exc.errno in _PERMANENT_ERRNOS:
            return ElectionError(f"cannot open {what} {path}: {exc.strerror}")
        return exc

    def _prepare(self, attempt: _Attempt, watcher: _Watcher) -> tuple[int, int]:
        """Open the lock file and ``.waiting`` for a campaign and watch both; their watch descriptors.

        Runs in a worker thread; the descriptors go into ``attempt`` as soon as they
        exist, so that a campaign cancelled meanwhile still closes them.
        """
        problem = _directory_problem(self.directory, self.mode)
        if problem is not None:
            raise ElectionError(problem)
        attempt.lock_fd = self._open(self.path, "lock file", create=True, write=True, fix=True)
        lock_wd = watcher.add(self.path)
        attempt.waiting_fd = self._open(self.waiting, "queue file", create=True, write=False, fix=True)
        return lock_wd, watcher.add(self.waiting)

    # --- campaign ----------------------------------------------------------------

    def _announce(self, attempt: _Attempt, watcher: _Watcher, channel: _Channel, wd: int) -> asyncio.Event | None:
        """Join the ``.waiting`` queue (opened by :meth:`_prepare`); if other candidates were waiting
        already, return the event that fires when one of them leaves it (None: nobody waits)."""
        # Registered and read before looking, so that a waiter leaving after our look is not missed.
        watched = watcher.register(wd, channel.left)
        left = channel.left.event
        try:
            fcntl.flock(attempt.waiting_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # succeeds only if nobody holds it shared
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
        """Take the lock on a fresh descriptor of ``path``; return when the winning try was sent.

        Opening runs in a worker thread; the tries (``flock`` with ``LOCK_NB`` on a
        descriptor already open) never block, and run on the loop.
        """
        watcher = _watcher(self)
        channel = watcher.channel(self.path)
        lock_wd, waiting_wd = await anyio.to_thread.run_sync(self._prepare, attempt, watcher)
        events = watcher.register(lock_wd, channel.closed)
        if not events and not self._polling_logged:
            self._polling_logged = True
            self.log.info("followers poll every %gs: %s", self.poll_interval, watcher.error or "no inotify")
        left = self._announce(attempt, watcher, channel, waiting_wd)
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
                token = await anyio.to_thread.run_sync(self._record, attempt.lock_fd, identity)
                if token is None:
                    # The file was replaced between our open and our lock: a lock on an
                    # inode nobody else opens any more guards nothing, so start over.
                    self.log.debug("lock file was replaced while locking; opening it again")
                    continue
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
        """The sidecar's content, None if there is none; ElectionError if it is not ours. Worker threads only."""
        try:
            fd = self._open(self.sidecar, "sidecar", create=False, write=False, fix=False)
        except FileNotFoundError:
            return None
        try:
            raw = _read_bounded(fd, _SIDECAR_LIMIT)
        finally:
            os.close(fd)
        if raw is None:
            raise ElectionError(
                f"sidecar {self.sidecar} is larger than {_SIDECAR_LIMIT} bytes: not an aioelect leader file; "
                "move it away"
            )
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or not isinstance(data.get("token"), int):
                raise ValueError("no token")
        except ValueError:
            raise ElectionError(f"{self.sidecar} is not an aioelect leader file; move it away") from None
        return data

    def _stored_token(self, fd: int) -> int:
        """The last token kept in the lock file (0 for a new, empty one). Worker threads only."""
        raw = os.pread(fd, 4096, 0)
        if not raw:
            return 0
        match = _TOKEN_PATTERN.fullmatch(raw)
        if match is None:
            raise ElectionError(
                f"lock file {self.path} is not an aioelect lock file ({len(raw)} bytes of something else): "
                "aioelect keeps its token there and never overwrites another file; choose a path of its own"
            )
        return int(match.group(1))

    def _record(self, fd: int, identity: str) -> int | None:
        """Keep the next token in the lock file, then write identity and token to the sidecar; return the token.

        None if ``path`` no longer names the file open on ``fd`` (nothing written).
        Runs in a worker thread, only while we hold the lock, so no other
        candidate writes concurrently. The token is one more than the larger of
        the lock file's and the sidecar's, so deleting either one (a tmp
        cleaner) does not make tokens start again: both are fsynced.
        """
        if not _same_file(fd, self.path):
            return None
        previous = self._read()
        last = max(self._stored_token(fd), int(previous["token"]) if previous else 0)
        token = last + 1
        os.pwrite(fd, _TOKEN_RECORD % token, 0)
        os.fsync(fd)  # so that the token survives a host crash and never goes backwards
        data = {
            "identity": identity,
            "token": token,
            "name": self.name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "acquired_at": time.time(),
        }
        tmp = f"{self.sidecar}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, self.mode)
        try:
            try:
                os.fchmod(out, self.mode)  # what the umask removed
                os.write(out, json.dumps(data).encode() + b"\n")
                os.fsync(out)
            finally:
                os.close(out)
            os.replace(tmp, self.sidecar)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        try:
            # The directory of the configured path, symbolic links in it included: O_DIRECTORY, not O_NOFOLLOW.
            dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass  # best effort: the rename itself is atomic
        return token

    def _close_probe(self) -> None:
        with self._probe_lock:
            probe, self._probe_fd = self._probe_fd, -1
        if probe >= 0:
            _close(probe)

    async def aclose(self) -> None:
        self._close_probe()
        fd = _unwatch(self)
        if fd >= 0:
            await anyio.to_thread.run_sync(_close, fd)  # waits for a kernel grace period: off the loop

    # --- who leads -----------------------------------------------------------------

    def _locked(self) -> bool:
        """True if someone holds the lock: a shared lock cannot be taken without blocking.

        Probes on a descriptor kept open (reopened if the file was replaced): a close
        would wake every waiting follower for nothing. A follower whose try meets our
        probe's instant shared lock tries again :data:`_RECHECK` later. Worker threads only.
        """
        with self._probe_lock:
            fd = self._probe_fd
            if fd >= 0 and not _same_file(fd, self.path):
                self._probe_fd = -1
                os.close(fd)
                fd = -1
            if fd < 0:
                try:
                    fd = self._probe_fd = self._open(self.path, "lock file", create=False, write=False, fix=False)
                except FileNotFoundError:
                    return False
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False

    def _look(self) -> tuple[bool, str | None]:
        """(someone holds the lock, the identity recorded in the sidecar). Worker threads only."""
        try:
            if not self._locked():
                return False, None
            data = self._read()
        except OSError as exc:
            raise BackendUnavailable(f"cannot read lock file {self.path}: {exc.strerror or exc!r}") from None
        identity = data.get("identity") if data is not None else None
        return True, identity if isinstance(identity, str) else None

    async def leader(self) -> str | None:
        async def look() -> tuple[bool, str | None]:
            return await anyio.to_thread.run_sync(self._look)

        # Only the first leader of a lock file is ever without a record.
        locked, identity = await until_recorded(look, lambda seen: not seen[0] or seen[1] is not None)
        if not locked:
            return None
        return identity if identity is not None else f"unknown holder of {self.path}"
