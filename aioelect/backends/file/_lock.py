"""The lock file and its records: the ``flock`` leadership, the token kept in the lock file, the sidecar.

Owns what a leadership on a lock file is. Guarantees:

* leadership is ``flock(LOCK_EX)`` on a descriptor of our own; the kernel
  drops it when the holder's process dies, and :meth:`FileHold.release`
  unlocks *before* it closes, so that followers woken by the close find the
  lock free;
* tokens never go backwards: the next token is one more than the larger of
  the lock file's record and the sidecar's, both fsynced before the
  leadership is reported, so deleting one of the two files (a tmp cleaner)
  does not make them start again;
* a lock file with content other than our token record is refused, never
  overwritten; the sidecar is read up to :data:`SIDECAR_LIMIT` bytes,
  whatever its size says, and replaced atomically (rename);
* :meth:`LockFile.look` tells whether someone holds the lock on a
  descriptor kept open until :meth:`LockFile.close_probe`, so that observers
  never close the lock file (a close would wake every waiting follower).

Everything here except :meth:`FileHold.monitor` and
:meth:`FileHold.release` does file I/O: call it in a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import socket
import threading
import time
from typing import Any

import anyio
import anyio.to_thread

from ...core._backend import Confirm, Hold, Loss, monotonic
from ...core._errors import BackendUnavailable, LossKind, PermanentBackendError
from ...core._log import ElectionLog
from . import _fork
from ._paths import at_path, close_fd, open_checked, read_bounded, same, same_file

__all__ = ["SIDECAR_LIMIT", "FileHold", "LockFile"]

#: The sidecar is read up to this size; a larger one is refused, whatever its st_size says.
SIDECAR_LIMIT = 64 * 1024
#: The lock file holds the last token, fixed width so that it is rewritten in place.
_TOKEN_RECORD = b"aioelect-token %019d\n"
_TOKEN_PATTERN = re.compile(rb"aioelect-token (\d{1,19})\n")


class LockFile:
    """One election's lock file (``path``), its directory and its sidecar, opened with ``mode``."""

    def __init__(self, path: str, directory: str, sidecar: str, mode: int, name: str) -> None:
        self.path = path
        self.directory = directory
        self.sidecar = sidecar
        self.mode = mode
        self.name = name
        #: The descriptor look() probes the lock on, once it was called; closed by close_probe().
        self._probe_fd = -1
        #: look() runs in worker threads: one probe at a time on the shared descriptor.
        self._probe_lock = threading.Lock()

    def read_sidecar(self) -> dict[str, Any] | None:
        """The sidecar's content, None if there is none; ElectionError if it is not ours."""
        try:
            fd = open_checked(self.sidecar, "sidecar", self.mode, create=False, write=False)
        except FileNotFoundError:
            return None
        try:
            raw = read_bounded(fd, SIDECAR_LIMIT)
        finally:
            os.close(fd)
        if raw is None:
            raise PermanentBackendError(
                f"sidecar {self.sidecar} is larger than {SIDECAR_LIMIT} bytes: not an aioelect leader file; "
                "move it away"
            )
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or not isinstance(data.get("token"), int):
                raise ValueError("no token")
        except ValueError:
            raise PermanentBackendError(f"{self.sidecar} is not an aioelect leader file; move it away") from None
        return data

    def stored_token(self, fd: int) -> int:
        """The last token kept in the lock file open on ``fd`` (0 for a new, empty one)."""
        raw = os.pread(fd, 4096, 0)
        if not raw:
            return 0
        match = _TOKEN_PATTERN.fullmatch(raw)
        if match is None:
            raise PermanentBackendError(
                f"lock file {self.path} is not an aioelect lock file ({len(raw)} bytes of something else): "
                "aioelect keeps its token there and never overwrites another file; choose a path of its own"
            )
        return int(match.group(1))

    def record(self, fd: int, identity: str) -> int | None:
        """Keep the next token in the lock file, then write identity and token to the sidecar; return the token.

        None if ``path`` no longer names the file open on ``fd`` (nothing written).
        Only while we hold the lock, so no other candidate writes concurrently.
        """
        if not same_file(fd, self.path):
            return None
        previous = self.read_sidecar()
        last = max(self.stored_token(fd), int(previous["token"]) if previous else 0)
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
        self.replace(self.sidecar, json.dumps(data).encode() + b"\n")
        return token

    def replace(self, path: str, content: bytes) -> None:
        """Make ``path`` (beside the lock file) hold ``content``, atomically and durably: a new file renamed over it."""
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, self.mode)
        try:
            try:
                os.fchmod(out, self.mode)  # what the umask removed
                os.write(out, content)
                os.fsync(out)
            finally:
                os.close(out)
            os.replace(tmp, path)
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

    def _locked(self) -> bool:
        """True if someone holds the lock: a shared lock cannot be taken without blocking.

        Probes on a descriptor kept open (reopened if the file was replaced): a close
        would wake every waiting follower for nothing. A follower whose try meets our
        probe's instant shared lock tries again soon after (its recheck).
        """
        with self._probe_lock:
            fd = self._probe_fd
            if fd >= 0 and not same_file(fd, self.path):
                self._probe_fd = -1
                os.close(fd)
                fd = -1
            if fd < 0:
                try:
                    fd = self._probe_fd = open_checked(self.path, "lock file", self.mode, create=False, write=False)
                except FileNotFoundError:
                    return False
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False

    def try_lock(self, fd: int) -> bool | None:
        """One ``flock(LOCK_EX | LOCK_NB)`` on ``fd``: True if we now hold the lock, False if another does.

        None while this process's own probe is looking (try again soon): the
        probe's instant shared lock would otherwise fail the try, and no close
        event would follow to wake the campaign. Never blocks.
        """
        if not self._probe_lock.acquire(blocking=False):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            self._probe_lock.release()
        return True

    def look(self) -> tuple[bool, str | None]:
        """(someone holds the lock, the identity recorded in the sidecar)."""
        try:
            if not self._locked():
                return False, None
            data = self.read_sidecar()
        except OSError as exc:
            raise BackendUnavailable(f"cannot read lock file {self.path}: {exc.strerror or exc!r}") from None
        identity = data.get("identity") if data is not None else None
        return True, identity if isinstance(identity, str) else None

    def close_probe(self) -> None:
        """Close the descriptor :meth:`look` probes on, if any; it never holds the lock past a probe."""
        with self._probe_lock:
            probe, self._probe_fd = self._probe_fd, -1
        if probe >= 0:
            close_fd(probe)


class FileHold(Hold):
    """A held ``flock`` on the descriptor ``fd`` of ``lock``'s path."""

    def __init__(
        self, lock: LockFile, check_interval: float, log: ElectionLog, fd: int, token: int, acquired_at: float
    ) -> None:
        self._lock = lock
        self._check_interval = check_interval
        self._log = log
        self._fd = fd
        self.token = token
        self.acquired_at = acquired_at
        #: Held by a fenced write and by release(): the descriptor (and with it the lock) stays through a write.
        self.writing = anyio.Lock()
        _fork.track(self)

    async def monitor(self, confirm: Confirm) -> Loss:
        """Lost only if the lock file is deleted or replaced: the kernel never takes a live process's lock."""
        path = self._lock.path
        while True:
            await anyio.sleep(self._check_interval)
            sent = monotonic()
            try:
                found = await anyio.to_thread.run_sync(at_path, path)  # a path lookup: off the loop
                if self._fd < 0:
                    return Loss(LossKind.CONNECTION_LOST, "lock file descriptor was closed")
                mine = os.fstat(self._fd)  # on the loop: the descriptor is closed only here, by release()
            except OSError as exc:
                return Loss(LossKind.CONNECTION_LOST, f"lock file check failed: {exc!r}")
            if found is None or not same(found, mine):
                return Loss(LossKind.DEPOSED, f"lock file {path} was deleted or replaced")
            confirm(sent)

    def descriptors(self) -> tuple[int, ...]:
        return () if self._fd < 0 else (self._fd,)

    @property
    def fd(self) -> int:
        """The locked descriptor; -1 once released."""
        return self._fd

    async def release(self) -> None:
        async with self.writing:
            await self._release()

    async def _release(self) -> None:
        fd, self._fd = self._fd, -1
        _fork.untrack(self)
        if fd < 0:
            return
        try:
            # Unlock before closing: the close is what wakes the followers (inotify), and
            # their try must then find the lock free.
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            self._log.debug("unlock failed (%r); closing the file drops the lock", exc)
        finally:
            os.close(fd)

    def forget(self) -> None:
        """In a forked child: close our copy of the descriptor without unlocking the parent's lock."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            close_fd(fd)
