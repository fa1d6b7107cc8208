"""``etcdctl elect NAME PROPOSAL``: the Go reference (``clientv3/concurrency``), one Go process per candidate.

etcdctl 3.4's ``elect`` uses the session default TTL of 60 s (it has no TTL
flag). It prints the leader key once elected; it acts as leader from then
until it exits: on SIGINT it resigns, and it exits with "session expired" as
soon as its keep-alive learns that the lease is gone. The driver signals the
Go process itself (this wrapper only relays its output).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import uuid

from ._runner import Candidate, Options, main


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class EtcdctlElect(Candidate):
    def __init__(self, options: Options) -> None:
        self.endpoint = options.url
        self.name = options.name
        self.binary = shutil.which("etcdctl") or "/usr/bin/etcdctl"
        self.proc: asyncio.subprocess.Process | None = None
        self.elected = False

    async def campaign(self) -> None:
        self.elected = False
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            f"--endpoints={self.endpoint}",
            "elect",
            self.name,
            f"bench-{uuid.uuid4().hex[:8]}",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            env=dict(os.environ, ETCDCTL_API="3"),
            preexec_fn=_die_with_parent,
        )
        self.proc = proc
        assert proc.stdout is not None
        line = await proc.stdout.readline()  # the leader key, printed once elected
        if not line:
            await proc.wait()
            raise RuntimeError(f"etcdctl elect exited with status {proc.returncode} before leading")
        self.elected = True
        asyncio.get_running_loop().create_task(self._drain(proc))

    async def _drain(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while await proc.stdout.readline():
            pass
        await proc.wait()

    def acting(self) -> bool:
        return self.elected and self.proc is not None and self.proc.returncode is None

    def signal_pid(self) -> int:
        return self.proc.pid if self.proc is not None else os.getpid()

    async def release(self) -> None:
        self.elected = False
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)  # etcdctl resigns on SIGINT
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def close(self) -> None:
        await self.release()


def make(options: Options, slot: int) -> Candidate:
    return EtcdctlElect(options)


if __name__ == "__main__":
    main(make)
