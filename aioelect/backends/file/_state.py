"""Fenced state on the file backend: ``path.state`` beside the lock file, written only under the election's lock.

A write runs while the writer holds the election's ``flock`` on the lock
file that ``path`` still names, and the token kept in that file is the
writer's: the descriptor stays open (so the lock stays held) until the write
has ended, because a release waits for it. No other candidate can hold the
lock meanwhile, so no newer token can be issued during the write. The file
is JSON (key -> the value's JSON text), replaced atomically and durably.
"""

from __future__ import annotations

import json
import os

import anyio.to_thread

from ...core._backend import Hold, StateStore, Written
from ...core._errors import PermanentBackendError
from ._lock import FileHold, LockFile
from ._paths import open_checked, read_bounded, same_file

__all__ = ["FileStateStore"]

#: The largest state file read: many values of the largest size.
STATE_LIMIT = 64 * 1024 * 1024


class FileStateStore(StateStore):
    def __init__(self, lock: LockFile) -> None:
        self._lock = lock
        self.path = lock.path + ".state"
        #: Requests (post): a file of their own, as a poster holds no lock to write the state file under.
        self.requests = lock.path + ".requests"

    def _load(self, path: str | None = None) -> dict[str, str]:
        path = self.path if path is None else path
        try:
            fd = open_checked(path, "state file", self._lock.mode, create=False, write=False)
        except FileNotFoundError:
            return {}
        try:
            raw = read_bounded(fd, STATE_LIMIT)
        finally:
            os.close(fd)
        try:
            data = json.loads(raw) if raw is not None else None
            if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
                raise ValueError("not a map of strings")
        except ValueError:
            raise PermanentBackendError(f"{path} is not an aioelect state file; move it away") from None
        return data

    def _post(self, key: str, value: bytes) -> None:
        values = self._load(self.requests)
        values[key] = value.decode()
        self._lock.replace(self.requests, json.dumps(values, sort_keys=True).encode())

    async def post(self, key: str, value: bytes) -> None:
        await anyio.to_thread.run_sync(self._post, key, value)

    async def read_posted(self, key: str) -> bytes | None:
        value = (await anyio.to_thread.run_sync(self._load, self.requests)).get(key)
        return None if value is None else value.encode()

    async def read(self, key: str) -> bytes | None:
        value = (await anyio.to_thread.run_sync(self._load)).get(key)
        return None if value is None else value.encode()

    def _write(self, fd: int, token: int, key: str, value: bytes, compare: bool, expected: bytes | None) -> Written:
        """Under the election's lock (held on ``fd``), in a worker thread."""
        if fd < 0 or not same_file(fd, self._lock.path) or self._lock.stored_token(fd) != token:
            return Written.FENCED
        values = self._load()
        current = values.get(key)
        if compare and (None if current is None else current.encode()) != expected:
            return Written.CONFLICT
        values[key] = value.decode()
        self._lock.replace(self.path, json.dumps(values, sort_keys=True).encode())
        return Written.DONE

    async def write(self, hold: Hold, key: str, value: bytes, *, compare: bool, expected: bytes | None) -> Written:
        if not isinstance(hold, FileHold) or hold.token is None:
            return Written.FENCED
        written = Written.FENCED  # unless the write below runs
        async with hold.writing:
            with anyio.CancelScope(shield=True):  # the worker thread runs on: the lock is held until it ends
                written = await anyio.to_thread.run_sync(
                    self._write, hold.fd, hold.token, key, value, compare, expected
                )
        return written
