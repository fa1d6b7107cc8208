"""The process supervisor of ``aioelect run``: CMD and everything it starts, always stoppable.

It knows nothing of leadership. It guarantees:

* CMD runs in a process group of its own, whose id is CMD's pid, so that
  signals forwarded to CMD reach every process CMD left in that group;
* on Linux CMD runs under a shim (:mod:`aioelect.cli._shim`), a child
  subreaper between this process and CMD: every process CMD starts, even
  one that leaves CMD's process group or session or double-forks, stays
  the shim's descendant; :meth:`ProcessGroup.terminate` and
  :meth:`ProcessGroup.kill` reach all of them, and return once all are
  gone (the shim exits only then);
* when this process dies, whatever kills it (SIGKILL included) or however
  it crashes, the shim SIGKILLs every descendant of CMD at once, and keeps
  the descriptors it was given (the lock's) open until they are all gone
  (Linux only: elsewhere CMD runs in its process group without a shim, and
  neither it nor its processes die with a SIGKILLed supervisor);
* should the shim die of a signal, this process (a child subreaper while
  CMD runs) inherits what is left of CMD's tree and
  :meth:`ProcessTree.aclose` SIGKILLs it;
* :meth:`ProcessGroup.terminate` sends SIGTERM, waits ``grace`` seconds,
  then SIGKILL, and returns only once CMD's processes are gone (or
  :data:`KILL_WAIT` after SIGKILL, logged as an error);
* :func:`reap_orphans` reaps the orphans the kernel hands to this process
  when it runs as PID 1 (in a container), so no zombies pile up;
* :func:`child_environment` hands CMD the environment without aioelect's
  secrets (:func:`aioelect._settings.is_secret`) unless passed by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import cast

import anyio

from .._settings import is_secret
from ._orphans import KILL_WAIT, reap_orphans, start_time
from ._orphans import SHIMS as _SHIMS
from ._orphans import end_strays as _end_strays
from ._shim import processes

__all__ = [
    "DEFAULT_GRACE",
    "STOP_SIGNALS",
    "KILL_RESERVE",
    "KILL_WAIT",
    "ProcessGroup",
    "ProcessTree",
    "child_environment",
    "exit_status",
    "group_alive",
    "reap_orphans",
]

log = logging.getLogger("aioelect.cli")

#: Seconds of the safety margin kept for a loss to be noticed and SIGKILL to take effect.
KILL_RESERVE = 0.5
#: The grace between SIGTERM and SIGKILL where leadership cannot be taken away while this process lives.
DEFAULT_GRACE = 10.0

#: The signals ``aioelect run`` handles: each is forwarded to CMD's group and stops the campaign, where the
#: default action would end aioelect with CMD left behind (SIGPIPE included, which Python ignores).
STOP_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGPIPE,
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
    """Whether process group ``pgid`` has a live (not zombie) member."""
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        return any(fields[0] != b"Z" and int(fields[2]) == pgid for _, fields in processes())
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
    async def start(cls, argv: Sequence[str], env: Mapping[str, str], *, hold: Sequence[int] = ()) -> ProcessGroup:
        """Start ``argv`` (under the shim on Linux); FileNotFoundError or another OSError if it cannot be executed.

        ``hold``: descriptors the shim keeps a duplicate of until CMD's whole tree is gone (Linux only).
        """
        if _use_shim():
            return await ProcessTree.start_tree(argv, env, hold=hold)
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


class ProcessTree(ProcessGroup):
    """CMD under the shim: :meth:`terminate` and :meth:`kill` reach every descendant, wherever it went.

    ``process`` is the shim's; CMD's exit status comes from the shim.
    """

    def __init__(
        self,
        shim: asyncio.subprocess.Process,
        pid: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.process = shim
        self.pid = pid
        self.exited = asyncio.get_running_loop().create_future()
        #: Descendants still alive when CMD exited.
        self.left = 0
        self._writer = writer
        #: When the shim started: CMD's tree started no earlier.
        self._started = start_time(shim.pid) or 0
        self._shim_exited: asyncio.Future[int] = asyncio.ensure_future(shim.wait())
        self._shim_exited.add_done_callback(lambda _: _SHIMS.discard(shim.pid))
        self._reading = asyncio.ensure_future(self._read(reader))

    @classmethod
    async def start_tree(cls, argv: Sequence[str], env: Mapping[str, str], *, hold: Sequence[int] = ()) -> ProcessTree:
        """Start the shim, and ``argv`` under it; OSError (FileNotFoundError...) if it cannot be executed.

        The shim keeps a duplicate of each descriptor of ``hold`` (not passed to CMD) until it exits, that
        is until CMD's whole tree is gone: a lock that ends with its descriptor's last close outlives a
        supervisor killed with SIGKILL until then.
        """
        if _prctl is not None:  # should the shim die, CMD's orphans come to us (see aclose())
            _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        ours, theirs = socket.socketpair()
        kept: list[int] = []
        try:
            kept.extend(os.dup(fd) for fd in hold)  # duplicates of our own: the originals stay ours to close
            shim = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", _SHIM, str(theirs.fileno()), ",".join(map(str, kept)) or "-", *argv,
                env=dict(env), pass_fds=(theirs.fileno(), *kept), preexec_fn=_shim_setup,
            )  # fmt: skip
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            for fd in kept:
                os.close(fd)
        _SHIMS.add(shim.pid)
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        try:
            with anyio.fail_after(SHIM_START_WAIT):
                first = (await reader.readline()).split()
        except BaseException:
            writer.close()  # the shim kills whatever it started
            with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_WAIT):
                await shim.wait()
            raise
        if first[:1] == [b"pid"]:
            return cls(shim, int(first[1]), reader, writer)
        writer.close()
        await shim.wait()
        if first[:1] == [b"error"]:
            code = int(first[1])
            raise OSError(code, os.strerror(code), argv[0])
        raise OSError(errno.ECHILD, f"the process shim exited ({shim.returncode}) before CMD started", argv[0])

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            words = (await reader.readline()).split()
            if not words:  # the shim is gone: so is CMD, killed by PR_SET_PDEATHSIG
                if not self.exited.done():
                    log.error("the process shim above CMD (pid %d) died: CMD was killed", self.process.pid)
                    self.exited.set_result(-signal.SIGKILL)
                return
            if words[0] == b"exit" and len(words) == 3 and not self.exited.done():
                self.left = int(words[2])
                self.exited.set_result(int(words[1]))

    def _send(self, line: str) -> None:
        if self._writer.is_closing():
            return
        with contextlib.suppress(OSError):
            self._writer.write(line.encode() + b"\n")

    @property
    def running(self) -> bool:
        return not self.exited.done()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to CMD's process group, while CMD is not reaped (its id cannot have been reused)."""
        if not self.exited.done():
            super().signal(sig)

    def signal_tree(self, sig: int) -> None:
        """Send ``sig`` to every process of CMD's tree (CMD's group, and through the shim every descendant)."""
        self.signal(sig)
        self._send(f"signal {int(sig)}")

    def alive(self) -> bool:
        """Whether any process of CMD's tree still lives."""
        if not self.exited.done():
            return True
        return self.left > 0 and not self._shim_exited.done()

    async def gone(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait up to ``timeout`` for the shim to exit: CMD and every descendant are gone; True if it did."""
        with anyio.move_on_after(timeout):
            await asyncio.shield(self._shim_exited)
            if not self.exited.done():
                await asyncio.shield(self._reading)
            return True
        return False

    async def kill(self) -> None:
        """SIGKILL every process of CMD's tree at once and wait (bounded by :data:`KILL_WAIT`) for them."""
        self.signal(signal.SIGKILL)
        self._send("kill")
        if not await self.gone(KILL_WAIT):
            log.error("CMD's processes survived SIGKILL for %gs", KILL_WAIT)

    async def terminate(self, grace: float) -> None:
        """SIGTERM CMD's whole tree, SIGKILL after ``grace`` seconds; return once it is gone (or given up on)."""
        self.signal_tree(signal.SIGTERM)
        if await self.gone(grace):
            return
        log.warning("CMD's processes still running %gs after SIGTERM: sending SIGKILL", grace)
        await self.kill()

    async def aclose(self) -> None:
        """Close the line to the shim (which then kills whatever is left) and wait for it, bounded.

        If the shim died of a signal (killed by someone), SIGKILL what it left of CMD's tree: this
        process is a child subreaper while CMD runs, so those processes became its children (the
        children it has that were started after the shim). Then stop being a subreaper.
        """
        self._writer.close()
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(KILL_WAIT):
                await asyncio.shield(self._shim_exited)
                await asyncio.shield(self._reading)
            code = self.process.returncode
            if code is None or code < 0:
                await _end_strays(self._started)
        if not _SHIMS and _prctl is not None:
            _prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
