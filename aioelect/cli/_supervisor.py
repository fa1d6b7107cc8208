"""The process supervisor of ``aioelect run``: CMD and everything it starts, always stoppable.

It knows nothing of leadership. It guarantees:

* CMD runs in a process group of its own, whose id is CMD's pid, so that
  signals forwarded to CMD reach every process CMD left in that group;
* on Linux CMD runs under a shim (:mod:`aioelect.cli._shim`; started by
  :func:`aioelect.cli._start.start_cmd`, built on this module), a child
  subreaper between this process and CMD: every process CMD starts, even
  one that leaves CMD's process group or session or double-forks, stays
  the shim's descendant; where cgroup v2 is writable the shim and CMD's
  tree also run in a cgroup of their own (:mod:`aioelect.cli._cgroup`),
  which no fork, session or stop leaves;
* :class:`aioelect.cli._tree.ProcessTree` finds CMD's tree without the shim's help (the
  cgroup, the shim's descendants in /proc, what a dead shim left to this
  process), so a shim that CMD stopped, traced or killed changes nothing:
  :meth:`ProcessGroup.terminate` (SIGTERM to each process once, SIGCONT to
  the stopped, SIGKILL to all after ``grace``), :meth:`ProcessGroup.kill`
  and :meth:`ProcessGroup.aclose` return only once no process of the tree,
  the shim included, is alive, in whatever state it was; for as long as
  one lives they keep killing it and log an error every :data:`KILL_WAIT`
  seconds (the lock is released only after them);
* CMD's exit status is its own whenever it exited by itself (from the
  shim, or from CMD's zombie when the shim could not report it);
* when this process dies, whatever kills it (SIGKILL included) or however
  it crashes, the shim SIGKILLs every descendant of CMD at once, and keeps
  the descriptors it was given (the lock's) open until they are all gone
  (Linux only: elsewhere CMD runs in its process group without a shim, and
  neither it nor its processes die with a SIGKILLed supervisor);
* the log says which containment is used (INFO; WARNING when only the
  subreaper is) and which processes were signalled, with their states;
* :func:`reap_orphans` reaps the orphans the kernel hands to this process
  when it runs as PID 1 (in a container), so no zombies pile up;
* :func:`child_environment` hands CMD the environment without aioelect's
  secrets (:func:`aioelect.wiring._settings.is_secret`) unless passed by name.
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

from ..wiring._settings import is_secret
from ._orphans import KILL_WAIT, reap_orphans
from ._shim import live, processes

__all__ = [
    "DEFAULT_GRACE",
    "STOP_SIGNALS",
    "KILL_RESERVE",
    "KILL_WAIT",
    "ProcessGroup",
    "child_environment",
    "exit_status",
    "group_alive",
    "reap_orphans",
    "stop_timeout_for",
]

log = logging.getLogger("aioelect.cli")

#: Seconds of the safety margin kept for a loss to be noticed and SIGKILL to take effect.
KILL_RESERVE = 0.5
#: The grace between SIGTERM and SIGKILL where leadership cannot be taken away while this process lives.
DEFAULT_GRACE = 10.0


def stop_timeout_for(grace: float) -> float:
    """The elector's ``stop_timeout`` for CMD stopped with ``grace``: after a loss the keeper waits this long for
    CMD's tree (SIGTERM, ``grace``, SIGKILL, the kill waited for) before it lets the lock go."""
    return max(grace, DEFAULT_GRACE) + 2 * KILL_WAIT + 1


#: The signals ``aioelect run`` handles: each is forwarded to CMD's group and stops the campaign, where the
#: default action would end aioelect with CMD left behind. Not SIGPIPE: the kernel sends it for a write on a
#: socket or pipe the other end closed (a server that ended our session, a probe client gone, a dead shim), never
#: to ask for a stop; Python ignores it, and such a write fails with EPIPE instead.
STOP_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
#: How long the shim gets to start and execute CMD.
SHIM_START_WAIT = 30.0

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim.py")


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


def _shim_setup() -> None:  # pragma: no cover - runs in the forked child
    os.setpgid(0, 0)  # out of aioelect's group: a terminal's ^C reaches aioelect, which forwards it


def _use_shim() -> bool:
    return _prctl is not None and bool(sys.executable) and os.path.isdir("/proc/self")


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
    """Whether process group ``pgid`` has a live member (not a zombie; or a zombie main thread with live threads)."""
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        return any(int(fields[2]) == pgid and live(pid, fields[0]) for pid, fields in processes())
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

    @staticmethod
    async def start(argv: Sequence[str], env: Mapping[str, str]) -> ProcessGroup:
        """Start ``argv`` without the shim; FileNotFoundError or another OSError if it cannot be executed.

        CMD is started by :func:`aioelect.cli._start.start_cmd`, which uses
        the shim where it can and this elsewhere.
        """
        process = await asyncio.create_subprocess_exec(*argv, env=dict(env), preexec_fn=_child_setup)
        return ProcessGroup(process)

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

    async def aclose(self) -> None:
        """Release what watching CMD took (nothing for a bare process group)."""

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
