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
  moment the holding process dies, so takeover after a crash is immediate.
* The kernel cannot notify an asyncio task when a ``flock`` becomes free, and
  a blocking ``flock`` in a worker thread cannot be cancelled safely, so
  followers try ``LOCK_EX | LOCK_NB`` every ``poll_interval`` (50 ms by
  default): takeover within one ``poll_interval``, and no thread left behind.
* After locking, the leader writes its identity and a token (the previous
  token + 1) to the sidecar ``path + ".leader"`` (JSON, replaced atomically by
  rename): :meth:`~aioelect.Elector.leader` reads it, after checking with a
  non-blocking shared lock that someone actually holds the lock.
* The kernel never takes a ``flock`` from a live process, so there is no
  renew deadline: a leader only loses leadership if the lock file is deleted
  or replaced (checked every ``check_interval``). A frozen (SIGSTOPped)
  leader therefore keeps leadership until it is resumed or killed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import socket
import stat
import time
import weakref
from typing import Any

import anyio
import anyio.to_thread

from .._backend import Backend, Backoff, Confirm, Hold, monotonic
from .._config import positive, validate_name
from .._elector import Elector
from .._errors import BackendUnavailable, ElectionError

__all__ = ["FileElector", "SIDECAR_SUFFIX"]

#: The sidecar holding the leader's identity and token is ``path + SIDECAR_SUFFIX``.
SIDECAR_SUFFIX = ".leader"

# Errors that no retry can fix: the directory or file is missing, not ours, or read-only.
_PERMANENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EROFS, errno.ELOOP}

# Holds alive in this process: a forked child closes its inherited copies, so that
# the lock is not kept by a child that outlives the leader.
_live_holds: weakref.WeakSet[_FileHold] = weakref.WeakSet()


def _close_in_child() -> None:
    for hold in list(_live_holds):
        hold._forget()
    _live_holds.clear()


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
        self.poll_interval = poll_interval
        self.observe_interval = max(poll_interval, 0.1)
        self.check_interval = check_interval

    def describe_timing(self) -> str:
        return (
            f"lock file {self.path}, poll_interval={self.poll_interval:g}s check_interval={self.check_interval:g}s: "
            f"a follower takes over within {self.poll_interval:g}s of a release or crash; nothing to renew "
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

    async def campaign(self, identity: str) -> Hold:
        backoff = Backoff(first=0.05, maximum=1.0)
        while True:
            fd = -1
            try:
                fd = self._open()
                while True:
                    sent = monotonic()
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        await anyio.sleep(self.poll_interval)
                        continue
                    break
                # The file may have been replaced between our open and our lock: a lock on
                # an inode nobody else opens any more guards nothing, so start over.
                if not _same_file(fd, self.path):
                    self.log.debug("lock file was replaced while locking; opening it again")
                    os.close(fd)
                    fd = -1
                    continue
                token = await anyio.to_thread.run_sync(self._record, identity)
                hold = _FileHold(self, fd, token, sent)
                fd = -1
                return hold
            except ElectionError:
                raise
            except OSError as exc:
                if exc.errno in _PERMANENT_ERRNOS:
                    raise ElectionError(f"lock file {self.path}: {exc.strerror}") from None
                delay = backoff.next_delay()
                self.report_error(f"campaign interrupted ({exc!r})", delay)
                if fd >= 0:
                    os.close(fd)
                    fd = -1
                await anyio.sleep(delay)
            finally:
                if fd >= 0:
                    os.close(fd)  # closing drops a lock we may already hold

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

    # --- who leads -----------------------------------------------------------------

    def _locked(self) -> bool:
        """True if someone holds the lock: a shared lock cannot be taken without blocking."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)

    async def leader(self) -> str | None:
        await anyio.lowlevel.checkpoint()
        try:
            if not self._locked():
                return None
            data = self._read()
        except ElectionError:
            raise
        except OSError as exc:
            raise BackendUnavailable(f"cannot read lock file {self.path}: {exc.strerror or exc!r}") from None
        if data is None or not isinstance(data.get("identity"), str):
            return f"unknown holder of {self.path}"
        return str(data["identity"])


class FileElector(Elector):
    """A candidate in a single-host election on an exclusive ``flock``.

    Guarantees (beyond :class:`~aioelect.Elector`'s):

    * mutual exclusion between processes (and electors) **on one host**
      that use the same lock file ``path`` on a local file system (not NFS);
    * a follower takes over within ``poll_interval`` of a release, and of the
      leader's process dying for any reason (the kernel drops the lock);
    * each leadership gets a token one higher than the previous one for this
      lock file (kept in ``path + ".leader"`` with the identity, fsynced);
    * a leader loses leadership only if the lock file is deleted or replaced,
      noticed within ``check_interval``; there is no renew deadline, and a
      frozen leader keeps leadership until it resumes or dies.

    ``name`` is only a label for logs and the sidecar. Raises ValueError at
    construction if ``path``'s directory does not exist, cannot be reached,
    is not a directory or is not writable (the sidecar is replaced there), if
    ``path`` is a directory, or if an existing lock file is not readable. The
    same conditions arising later (directory removed, permissions changed)
    raise :class:`~aioelect.ElectionError` from :meth:`acquire`, at once.
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
