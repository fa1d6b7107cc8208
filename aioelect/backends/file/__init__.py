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
  locks, which belong to the whole process). The kernel never takes a
  ``flock`` from a live process, so there is no renew deadline: a leader
  only loses leadership if the lock file is deleted or replaced (checked
  every ``check_interval``), and a frozen (SIGSTOPped) leader keeps it until
  it is resumed or killed.
* **The event loop never waits for the disk.** Opening, reading, writing,
  renaming and fsyncing run in worker threads; on the loop run only calls
  on descriptors already open that cannot block (``flock`` with
  ``LOCK_NB``, ``fstat``, ``close``) and the reads of the inotify descriptor.

The modules, each with one job:

* :mod:`._lock`: the ``flock`` leadership, the token kept in the lock file,
  the sidecar ``path + ".leader"`` that :meth:`FileBackend.leader` reads;
* :mod:`._paths`: the rules every open follows, so that the files are safe in
  a directory other users share;
* :mod:`._inotify`, :mod:`._waiters` and :mod:`._fork`: what this module's
  campaign loop adds to a bare ``flock`` retry, each kept because of what it
  buys (``bench/FILE_PARTS.md`` has the figures):

  - **the inotify wait.** Every close of the lock file (a release, or the
    kernel closing a dead holder's files) wakes the followers, who then try
    ``LOCK_EX | LOCK_NB``: takeover within milliseconds of a release or a
    crash, and nothing to do while the leader lives, where polling waits up
    to ``poll_interval`` and makes every idle follower try all the time. The
    kernel reports a dying holder's close just *before* it drops the lock,
    so a try that fails right after an event is made again
    :data:`_RECHECK` later. Unlocks inotify cannot see (another process still
    sharing the holder's descriptor, a foreign program that unlocks without
    closing) are caught by a fallback try every
    ``max(poll_interval, 1 s)``. Where inotify is unavailable (not Linux, or
    the per-user limits are reached) followers try every ``poll_interval``;
  - **the waiters' queue.** A leader that releases and campaigns again lets a
    waiting follower take this turn instead of winning again: without it the
    releaser keeps the lock nearly every time where followers poll, and
    sometimes even with inotify;
  - **fork bookkeeping.** A forked child closes the copies it inherited of
    live campaigns' and holds' descriptors: without it a child keeps its
    parent's place in the queue (every new campaign defers to a phantom
    waiter), hides the parent's closes from inotify, and keeps the parent's
    lock after the parent dies.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TypedDict

import anyio
import anyio.to_thread

from ...core._backend import Backend, Backoff, Hold, StateStore, monotonic, until_recorded
from ...core._config import DEFAULT_NAME, check_options, positive, validate_name
from ...core._errors import BackendUnavailable, ElectionError, PermanentBackendError
from ._inotify import LockFileSignals, Watcher, Watching
from ._lock import FileHold, LockFile
from ._paths import MODES, PERMANENT_ERRNOS, directory_problem, open_checked, resolve
from ._state import FileStateStore
from ._waiters import Attempt, announce, rejoin

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["DEFAULT_MODE", "MIN_INTERVAL", "FileBackend", "FileOptions", "SIDECAR_SUFFIX", "WAITING_SUFFIX"]

#: The sidecar holding the leader's identity and token is ``path + SIDECAR_SUFFIX``.
SIDECAR_SUFFIX = ".leader"
#: Waiting candidates hold a shared ``flock`` on ``path + WAITING_SUFFIX``.
WAITING_SUFFIX = ".waiting"

#: The files are created for their owner only unless ``mode=`` says otherwise.
DEFAULT_MODE = 0o600
#: The shortest poll_interval and check_interval (seconds): a shorter one would only burn a core.
MIN_INTERVAL = 0.01

#: With inotify, how long after an event whose try failed to try once more: the kernel
#: reports a dying holder's close just before it drops the lock.
_RECHECK = 0.005
#: With inotify, the slowest followers ever retry without an event (closes inotify cannot see).
_FALLBACK = 1.0
#: With inotify, how often a campaign's watch of the leader looks without an event.
_WATCH_FALLBACK = 5.0
#: Upper bound on how long a new campaign lets announced waiters go first.
_MAX_HANDOVER = 0.25


class FileOptions(TypedDict, total=False):
    """The options of a lock-file election; :class:`FileBackend` validates them."""

    #: A label for logs and the sidecar (default ``aioelect/leader``).
    name: str
    #: Seconds between a follower's tries where inotify is unavailable (default 0.05, from 0.01 to 60).
    poll_interval: float
    #: Seconds between the leader's checks that its lock file is still in place (default 1, from 0.01 to 3600).
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
        if isinstance(mode, bool) or not isinstance(mode, int) or mode not in MODES:
            raise ValueError(
                f"mode must be 0o600 (the default: the owner only) or 0o660 (the users of a group too), not "
                f"{mode!r}: whoever may read the lock file can hold the lock forever, so other users never get "
                "access"
            )
        full, directory = resolve(path)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ValueError(
                f"directory {directory} is not writable: the lock file and its {SIDECAR_SUFFIX} sidecar live there"
            )
        problem = directory_problem(directory, mode)
        if problem is not None:
            raise ValueError(problem)
        if os.path.exists(full) and not os.access(full, os.R_OK | os.W_OK):
            raise ValueError(f"lock file {full} is not readable and writable (the token is kept in it)")
        name = validate_name(options.get("name", DEFAULT_NAME))
        poll_interval = positive("poll_interval", options.get("poll_interval", 0.05), minimum=MIN_INTERVAL, maximum=60)
        super().__init__(name)
        self.path = full
        self.directory = directory
        self.sidecar = full + SIDECAR_SUFFIX
        self.waiting = full + WAITING_SUFFIX
        self.mode = mode
        self.poll_interval = poll_interval
        self.observe_interval = max(poll_interval, 0.1)
        self.check_interval = positive(
            "check_interval", options.get("check_interval", 1.0), minimum=MIN_INTERVAL, maximum=3600
        )
        #: With inotify, the retry interval without events.
        self.fallback = max(poll_interval, _FALLBACK)
        #: How long a new campaign lets announced waiters go first, at most.
        self.handover = min(2 * poll_interval, _MAX_HANDOVER)
        self._polling_logged = False
        self._lockfile = LockFile(full, directory, self.sidecar, mode, name)
        #: This loop's inotify watcher, once we campaigned; given up by aclose().
        self._watching = Watching()
        if mode != DEFAULT_MODE:
            self.warnings.append(
                f"mode={oct(mode)}: the users of the lock file's group can open it and hold the lock; every one of "
                "them is trusted with this election"
            )

    def describe_timing(self) -> str:
        # One short line: the rest (inotify's fallback, the handover) is in the module's docstring.
        return (
            f"lock file {self.path} (a kernel lock): followers wake on its release, or poll every "
            f"{self.poll_interval:g}s without inotify"
        )

    # --- campaign ----------------------------------------------------------------

    def _prepare(self, attempt: Attempt, watcher: Watcher) -> tuple[int, int]:
        """Open the lock file and ``.waiting`` for a campaign and watch both; their watch descriptors.

        Runs in a worker thread; the descriptors go into ``attempt`` as soon as they
        exist, so that a campaign cancelled meanwhile still closes them (or, once
        it has closed ``attempt``, :meth:`Attempt.adopt` does).
        """
        problem = directory_problem(self.directory, self.mode)
        if problem is not None:
            raise PermanentBackendError(problem)
        attempt.adopt("lock_fd", open_checked(self.path, "lock file", self.mode, create=True, write=True, log=self.log))
        lock_wd = watcher.add(self.path)
        waiting = open_checked(self.waiting, "queue file", self.mode, create=True, write=False, log=self.log)
        attempt.adopt("waiting_fd", waiting)
        return lock_wd, watcher.add(self.waiting)

    async def _lock(self, attempt: Attempt) -> float:
        """Take the lock on a fresh descriptor of ``path``; return when the winning try was sent.

        Opening runs in a worker thread; the tries (``flock`` with ``LOCK_NB`` on a
        descriptor already open) never block, and run on the loop.
        """
        watcher = self._watching.get()
        channel: LockFileSignals = watcher.channel(self.path)
        lock_wd, waiting_wd = await anyio.to_thread.run_sync(self._prepare, attempt, watcher)
        events = watcher.register(lock_wd, channel.closed)
        if not events and not self._polling_logged:
            self._polling_logged = True
            self.log.info("followers poll every %gs: %s", self.poll_interval, watcher.error or "no inotify")
        left = announce(attempt, watcher, channel, waiting_wd)
        if left is not None:
            # Let a waiter take this turn: until one leaves the queue (it won, or gave up), bounded.
            started = monotonic()
            with anyio.move_on_after(self.handover):
                await left.wait()
            self.log.debug("let waiting candidates go first for %.1f ms", (monotonic() - started) * 1000)
        # The first failed try is repeated soon too: another process's probe of the lock
        # (an instant shared lock) may have met it, and no close event would follow.
        woken = True
        while True:
            closed = channel.closed.event  # read before trying: a close after the try wakes us
            sent = monotonic()
            if attempt.lock_fd < 0:  # closed under us by a fork
                raise OSError(errno.EBADF, "lock file descriptor was closed")
            won = self._lockfile.try_lock(attempt.lock_fd)
            if won is None:  # our own probe is looking: it ends at once
                await anyio.sleep(_RECHECK)
                continue
            if won:
                attempt.leave_queue()
                return sent
            if not attempt.announced:
                rejoin(attempt)
            if events and watcher.live:
                # Right after an event, once more soon: a dying holder's close is reported
                # just before its lock is dropped.
                with anyio.move_on_after(_RECHECK if woken else self.fallback) as scope:
                    await closed.wait()
                woken = not scope.cancelled_caught
            else:
                await anyio.sleep(self.poll_interval)

    def _record(self, fd: int, identity: str) -> int | None:
        """Record the new leadership (see :meth:`LockFile.record`). Worker threads only."""
        return self._lockfile.record(fd, identity)

    async def campaign(self, identity: str) -> Hold:
        backoff = Backoff(first=0.05, maximum=1.0)
        while True:
            attempt = Attempt()
            try:
                sent = await self._lock(attempt)
                token = await anyio.to_thread.run_sync(self._record, attempt.lock_fd, identity)
                if token is None:
                    # The file was replaced between our open and our lock: a lock on an
                    # inode nobody else opens any more guards nothing, so start over.
                    self.log.debug("lock file was replaced while locking; opening it again")
                    continue
                return FileHold(self._lockfile, self.check_interval, self.log, attempt.take_lock_fd(), token, sent)
            except ElectionError:
                raise
            except OSError as exc:
                if exc.errno in PERMANENT_ERRNOS:
                    raise PermanentBackendError(f"lock file {self.path}: {exc.strerror}") from None
                delay = backoff.next_delay()
                self.report_error(f"campaign interrupted ({exc!r})", delay)
                attempt.close()
                await anyio.sleep(delay)
            finally:
                attempt.close()

    def _open_lock(self, attempt: Attempt) -> None:
        """Open the lock file into ``attempt`` (worker threads only)."""
        problem = directory_problem(self.directory, self.mode)
        if problem is not None:
            raise PermanentBackendError(problem)
        attempt.adopt("lock_fd", open_checked(self.path, "lock file", self.mode, create=True, write=True, log=self.log))

    async def try_campaign(self, identity: str) -> Hold | None:
        """One ``flock`` with ``LOCK_NB``: the hold, or None (the descriptor closed) if another process holds it."""
        for _ in range(3):  # a lock file replaced under us is opened again, a bounded number of times
            attempt = Attempt()
            try:
                await anyio.to_thread.run_sync(self._open_lock, attempt)
                sent = monotonic()
                while (won := self._lockfile.try_lock(attempt.lock_fd)) is None:  # our own probe: it ends at once
                    await anyio.sleep(_RECHECK)
                    sent = monotonic()
                if not won:
                    return None
                token = await anyio.to_thread.run_sync(self._record, attempt.lock_fd, identity)
                if token is None:
                    continue
                return FileHold(self._lockfile, self.check_interval, self.log, attempt.take_lock_fd(), token, sent)
            except OSError as exc:
                if exc.errno in PERMANENT_ERRNOS:
                    raise PermanentBackendError(f"lock file {self.path}: {exc.strerror}") from None
                raise BackendUnavailable(f"lock file {self.path}: {exc.strerror or exc!r}") from None
            finally:
                attempt.close()
        raise BackendUnavailable(f"lock file {self.path} was replaced during each of 3 attempts")

    async def watch(self) -> AsyncIterator[str | None]:
        """Look again only when the lock file is closed (a release, a crash), as inotify tells the campaigns.

        Idle followers cost nothing: without an event, one look per
        :data:`_WATCH_FALLBACK` seconds (closes inotify cannot see); without
        inotify, one per ``poll_interval`` and at most one a second.
        """
        watcher = self._watching.get()
        channel = watcher.channel(self.path)
        last: object = object()
        while True:
            closed = channel.closed.event  # read before looking: a close after the look wakes us
            try:
                current = await self.leader()
            except BackendUnavailable as exc:
                self.log.debug("leader watch: %s", exc)
            else:
                if current != last:
                    last = current
                    yield current
            if watcher.live:
                with anyio.move_on_after(_WATCH_FALLBACK):
                    await closed.wait()
            else:
                await anyio.sleep(max(self.poll_interval, 1.0))

    def _new_state_store(self) -> StateStore:
        return FileStateStore(self._lockfile)

    async def close_observer(self) -> None:
        self._lockfile.close_probe()

    async def aclose(self) -> None:
        self._lockfile.close_probe()
        await self._watching.aclose()

    # --- who leads -----------------------------------------------------------------

    async def leader(self) -> str | None:
        async def look() -> tuple[bool, str | None]:
            return await anyio.to_thread.run_sync(self._lockfile.look)

        # Only the first leader of a lock file is ever without a record.
        locked, identity = await until_recorded(look, lambda seen: not seen[0] or seen[1] is not None)
        if not locked:
            return None
        return identity if identity is not None else f"unknown holder of {self.path}"
