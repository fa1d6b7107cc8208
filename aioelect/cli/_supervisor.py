"""The process supervisor of ``aioelect run``: CMD as a process group that can always be stopped.

It knows nothing of leadership. It guarantees:

* CMD runs in a process group of its own, whose id is CMD's pid, so that
  every process CMD starts (and leaves in the group) is signalled with it;
* on Linux CMD gets SIGKILL when this process dies, even of SIGKILL, so a
  crashed supervisor never leaves CMD running;
* :meth:`ProcessGroup.terminate` sends SIGTERM, waits ``grace`` seconds,
  then SIGKILL, and returns only once CMD has exited and its group is empty
  (or :data:`KILL_WAIT` after SIGKILL, logged as an error);
* :func:`child_environment` hands CMD the environment without aioelect's
  secrets (:func:`aioelect._settings.is_secret`) unless passed by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import cast

import anyio

from .._settings import is_secret

__all__ = [
    "DEFAULT_GRACE",
    "KILL_RESERVE",
    "KILL_WAIT",
    "ProcessGroup",
    "child_environment",
    "exit_status",
    "group_alive",
]

log = logging.getLogger("aioelect.cli")

#: Seconds of the safety margin kept for a loss to be noticed and SIGKILL to take effect.
KILL_RESERVE = 0.5
#: The grace between SIGTERM and SIGKILL where leadership cannot be taken away while this process lives.
DEFAULT_GRACE = 10.0
#: How long processes killed with SIGKILL get to be gone.
KILL_WAIT = 2.0

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return cast(Callable[..., int], ctypes.CDLL(None, use_errno=True).prctl)
    except (OSError, AttributeError):
        return None


# Resolved here, in the parent: the forked child only calls it.
_prctl = _load_prctl()


def _child_setup() -> None:  # pragma: no cover - runs in the forked child
    os.setpgid(0, 0)
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with aioelect, even on its SIGKILL


def child_environment(
    environ: Mapping[str, str], *, pass_secrets: Collection[str], extra: Mapping[str, str]
) -> dict[str, str]:
    """``environ`` without aioelect's secrets (except those in ``pass_secrets``), then ``extra``."""
    env = {k: v for k, v in environ.items() if not is_secret(k) or k in pass_secrets}
    env.update(extra)
    return env


def exit_status(returncode: int) -> int:
    """A process's status as a shell reports it: 128+N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a live (not zombie) member."""
    if sys.platform.startswith("linux"):
        try:
            entries = os.listdir("/proc")
        except OSError:
            entries = []
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != b"Z" and int(fields[2]) == pgid:
                return True
        if entries:
            return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ProcessGroup:
    """CMD, started by :meth:`start` in a process group of its own."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        #: CMD's pid, which is also its process group's id.
        self.pid = process.pid
        #: Done with CMD's return code once CMD has exited.
        self.exited: asyncio.Future[int] = asyncio.ensure_future(process.wait())

    @classmethod
    async def start(cls, argv: Sequence[str], env: Mapping[str, str]) -> ProcessGroup:
        """Start ``argv``; FileNotFoundError or another OSError if it cannot be executed."""
        process = await asyncio.create_subprocess_exec(*argv, env=dict(env), preexec_fn=_child_setup)
        return cls(process)

    @property
    def running(self) -> bool:
        """Whether CMD itself has not been reaped yet."""
        return self.process.returncode is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to CMD's process group: CMD and every process it started that stayed in it."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:  # the group is gone and its id reused: signal the child alone
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def alive(self) -> bool:
        """Whether any process of CMD's group still lives."""
        return group_alive(self.pid)

    async def status(self) -> int:
        """CMD's exit status; 128+SIGKILL if it was not seen to exit."""
        if self.exited.done() and not self.exited.cancelled():
            return exit_status(await self.exited)
        return 128 + signal.SIGKILL

    async def gone(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait up to ``timeout`` for CMD to exit and its process group to empty; True if both did."""
        with anyio.move_on_after(timeout):
            await asyncio.shield(self.exited)
            while group_alive(self.pid):  # noqa: ASYNC110 - nothing signals a group emptying: poll /proc
                await anyio.sleep(0.02)
            return True
        return False

    async def kill(self) -> None:
        """SIGKILL the group at once and wait (bounded by :data:`KILL_WAIT`) for it to be gone."""
        self.signal(signal.SIGKILL)
        await self.gone(KILL_WAIT)

    async def terminate(self, grace: float) -> None:
        """SIGTERM the group, then SIGKILL after ``grace`` seconds; return once it is gone (or given up on)."""
        self.signal(signal.SIGTERM)
        if await self.gone(grace):
            return
        log.warning("CMD's process group still running %gs after SIGTERM: sending SIGKILL", grace)
        self.signal(signal.SIGKILL)
        if not await self.gone(KILL_WAIT):
            log.error("CMD's process group %d survived SIGKILL for %gs", self.pid, KILL_WAIT)
