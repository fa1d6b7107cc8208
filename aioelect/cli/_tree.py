"""CMD's whole tree under the shim on Linux: found without the shim's help (its cgroup v2 where writable, the
shim's descendants, what a dead shim left to this process), signalled and waited for until no process of it is
alive, whatever state it is in. :func:`aioelect.cli._start.start_cmd` starts CMD here when the shim is used; this
module is built on :mod:`aioelect.cli._supervisor`, which imports nothing of it."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence

import anyio

from ._cgroup import Cgroup, Containment
from ._cgroup import create as create_cgroup
from ._orphans import KILL_WAIT, STATES, reap, start_time, stat, strays
from ._orphans import SHIMS as _SHIMS
from ._shim import descendants, kill_sessions, live_threads, signal_process
from ._supervisor import _PR_SET_CHILD_SUBREAPER, _SHIM, SHIM_START_WAIT, ProcessGroup, _prctl, _shim_setup, exit_status

__all__ = ["ProcessTree"]

log = logging.getLogger("aioelect.cli")

#: How often the tree is looked at while it is being ended.
_POLL = 0.02
#: How often the shim is looked at while CMD runs: a stopped shim cannot report CMD's exit.
_WATCH = 0.5


#: Shims being started: until one is in SHIMS, it would look like a stray of another tree.
_starting = 0


class ProcessTree(ProcessGroup):
    """CMD under the shim: :meth:`terminate` and :meth:`kill` reach every process of its tree, wherever it went.

    The tree is every process in CMD's cgroup (where cgroup v2 is writable), every descendant of the shim, and
    what a dead shim left to this process (a child subreaper); the shim is part of it. The tree is found
    without the shim's help, so a shim that CMD stopped, traced or killed changes nothing: :meth:`terminate`,
    :meth:`kill` and :meth:`aclose` return only once no process of the tree is alive, in whatever state it
    was (they keep killing, and log an error every :data:`KILL_WAIT` seconds, for as long as one lives).

    ``process`` is the shim's; CMD's exit status comes from the shim, or from CMD's zombie.
    """

    def __init__(
        self,
        shim: asyncio.subprocess.Process,
        pid: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        cgroup: Cgroup | None,
    ) -> None:
        self.process = shim
        self.pid = pid
        #: Done once CMD is no longer running under a live shim (the return code is a guess until status()).
        self.exited = asyncio.get_running_loop().create_future()
        #: CMD's own return code, once known: from the shim, or read from its zombie.
        self.returncode: int | None = None
        #: Where CMD's tree is contained, besides the shim's and this process's subreapers.
        self.cgroup = cgroup
        self._writer = writer
        self._closing = False
        #: When the shim started: CMD's tree started no earlier.
        self._started = start_time(shim.pid) or 0
        self._shim_exited: asyncio.Future[int] = asyncio.ensure_future(shim.wait())
        self._shim_exited.add_done_callback(lambda _: _SHIMS.discard(shim.pid))
        self._reading = asyncio.ensure_future(self._read(reader))
        self._watching = asyncio.ensure_future(self._watch())

    @classmethod
    async def start_tree(cls, argv: Sequence[str], env: Mapping[str, str], *, hold: Sequence[int] = ()) -> ProcessTree:
        """Start the shim, and ``argv`` under it; OSError (FileNotFoundError...) if it cannot be executed.

        The shim keeps a duplicate of each descriptor of ``hold`` (not passed to CMD) until it exits, that
        is until CMD's whole tree is gone: a lock that ends with its descriptor's last close outlives a
        supervisor killed with SIGKILL until then. The shim and CMD's tree run in a cgroup v2 of their own
        where one can be made.
        """
        if _prctl is not None:  # should the shim die, CMD's orphans come to us (see aclose())
            _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        made = create_cgroup()
        cgroup = made if isinstance(made, Cgroup) else None
        global _starting
        ours, theirs = socket.socketpair()
        kept: list[int] = []
        _starting += 1
        try:
            kept.extend(os.dup(fd) for fd in hold)  # duplicates of our own: the originals stay ours to close
            shim = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", _SHIM, str(theirs.fileno()), ",".join(map(str, kept)) or "-",
                cgroup.path if cgroup is not None else "-", *argv,
                env=dict(env), pass_fds=(theirs.fileno(), *kept), preexec_fn=_shim_setup,
            )  # fmt: skip
        except BaseException:
            ours.close()
            if cgroup is not None:
                cgroup.remove()
            raise
        finally:
            _starting -= 1
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
            if cgroup is not None:
                cgroup.kill()
                cgroup.remove()
            raise
        if first[:1] == [b"pid"]:
            joined = first[2].decode() if len(first) > 2 else "-"
            if cgroup is not None and joined != "in":
                reason = f"moving into {cgroup.path} failed: {os.strerror(int(joined)) if joined.isdigit() else joined}"
                cgroup.remove()  # empty: the shim is not in it
                cgroup = None
                made = OSError(reason)
            Containment.say(cgroup, str(made))
            return cls(shim, int(first[1]), reader, writer, cgroup)
        writer.close()
        await shim.wait()
        if cgroup is not None:
            cgroup.remove()
        if first[:1] == [b"error"]:
            code = int(first[1])
            raise OSError(code, os.strerror(code), argv[0])
        raise OSError(errno.ECHILD, f"the process shim exited ({shim.returncode}) before CMD started", argv[0])

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                words = (await reader.readline()).split()
            except OSError:  # reset: the shim was killed with our "kill" unread
                words = []
            if not words:  # the shim is gone (or we closed the line): CMD is no longer running under it
                if not self.exited.done():
                    if not self._closing:
                        # Its descriptors close before it exits: once it has, CMD has its SIGKILL (death signal).
                        with anyio.move_on_after(KILL_WAIT):
                            await asyncio.shield(self._shim_exited)
                        log.warning(
                            "the process shim (pid %d) died before CMD (pid %d) was seen to exit: ending what is "
                            "left of CMD's tree",
                            self.process.pid,
                            self.pid,
                        )
                    self._note_zombie()
                    self.exited.set_result(self.returncode if self.returncode is not None else -signal.SIGKILL)
                return
            if words[0] == b"exit" and len(words) == 3 and not self.exited.done():
                self.returncode = int(words[1])
                self.exited.set_result(self.returncode)

    async def _watch(self) -> None:
        """While CMD runs, look at the shim: stopped or traced, it cannot report CMD's exit, so look at CMD."""
        said = False
        while not self.exited.done():
            await anyio.sleep(_WATCH)
            shim = stat(self.process.pid)
            if self._shim_exited.done() or shim is None or shim[1] not in ("T", "t"):
                continue
            if not said:
                log.warning(
                    "the process shim above CMD (pid %d) is %s: CMD (pid %d) and its tree are watched without it",
                    self.process.pid,
                    "stopped" if shim[1] == "T" else "stopped by a tracer",
                    self.pid,
                )
                said = True
            self._note_zombie()
            if self.returncode is not None and not self.exited.done():
                self.exited.set_result(self.returncode)

    def _note_zombie(self) -> None:
        """If CMD is a zombie no one reaped (its shim stopped or killed), take its return code from /proc."""
        if self.returncode is not None:
            return
        fields = stat(self.pid)
        # Field 52 of stat (exit_code): the wait status, for a zombie. CMD's pid cannot be reused before it
        # is reaped; its start time rules out an older process.
        if fields is None or fields[1] != "Z" or len(fields) < 51 or int(fields[20]) < self._started:
            return
        if live_threads(self.pid):  # its main thread ended alone: CMD runs on
            return
        self.returncode = os.waitstatus_to_exitcode(int(fields[50]))

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

    async def status(self) -> int:
        """CMD's exit status: its own whenever it was seen to exit; 128+SIGKILL if it was not."""
        if self.returncode is not None:
            return exit_status(self.returncode)
        return await super().status()

    def members(self) -> dict[int, list[str]]:
        """Every live process of CMD's tree, the shim included, with its stat fields: not a zombie, or a zombie
        main thread whose other threads run (state ``Z+`` then).

        Found in CMD's cgroup, under the shim (a child subreaper: its descendants stay its descendants) and
        under this process (a child subreaper too) among what a dead shim left; none of these needs the
        shim to run.
        """
        pids: set[int] = set()
        if self.cgroup is not None:
            pids.update(self.cgroup.procs())
        if not self._shim_exited.done():
            pids.add(self.process.pid)
            pids.update(pid for pid, alive in descendants(self.process.pid) if alive)
        if not _starting:
            found, _ = strays(self._started)
            pids.update(pid for pid, alive in found if alive)
        members: dict[int, list[str]] = {}
        for pid in pids:
            fields = stat(pid)
            if fields is None:
                continue
            if fields[1] in ("Z", "X"):
                if not live_threads(pid):
                    continue
                fields = [fields[0], "Z+", *fields[2:]]
            members[pid] = fields
        return members

    def describe(self, members: Mapping[int, list[str]]) -> str:
        """``pid (name, state)`` for each of ``members``, the shim and CMD named as such."""
        parts = []
        for pid, fields in sorted(members.items()):
            role = "the shim" if pid == self.process.pid else "CMD" if pid == self.pid else fields[0]
            parts.append(f"{pid} ({role}, {STATES.get(fields[1], fields[1])})")
        return ", ".join(parts) or "none"

    def alive(self) -> bool:
        """Whether any process of CMD's tree other than the shim lives."""
        if not self.exited.done():
            return True
        return any(pid != self.process.pid for pid in self.members())

    def _empty(self) -> bool:
        return not _starting and not self.members() and (self.cgroup is None or not self.cgroup.populated())

    async def gone(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait up to ``timeout`` for every process of CMD's tree, the shim included, to be gone; True if all are.

        What a dead shim left to this process counts until reaped, zombies included: a process that forks and
        lets its parent exit again and again is gone by the time /proc is read, but always leaves a child
        here. Zombies this process cannot reap (a tracer's to reap first) count as gone once they stay the
        same from one look to the next (such a process leaves new ones).
        """
        held: set[int] | None = None
        with anyio.move_on_after(timeout):
            while True:
                self._reap_strays()
                zombies = self._zombie_strays()
                if self._empty() and (not zombies or zombies == held):
                    return True
                held = zombies
                await anyio.sleep(_POLL)
        return False

    def _zombie_strays(self) -> set[int]:
        """The children a dead shim left to this process that are zombies (not yet reaped)."""
        if _starting:
            return set()
        found, _ = strays(self._started)
        return {pid for pid, alive in found if not alive}

    def _reap_strays(self) -> None:
        """Reap the zombies a dead shim left to this process; CMD's gives its return code."""
        _, zombies = strays(self._started)
        for pid in zombies:
            code = reap(pid)
            if pid == self.pid and code is not None and self.returncode is None:
                self.returncode = code

    def _signal_each(self, sig: int, members: Mapping[int, list[str]]) -> list[int]:
        """Send ``sig`` once to each process of the tree but the shim (CMD's group at once, while CMD is not
        reaped); the pids it went to."""
        grouped = not self.exited.done()
        if grouped:
            self.signal(sig)
        sent = []
        for pid, fields in members.items():
            if pid == self.process.pid:
                continue
            sent.append(pid)
            if grouped and int(fields[3]) == self.pid and fields[1] != "Z+":
                continue  # it had it with CMD's group: a second one could end a process that handles the first
            signal_process(pid, sig)
        return sent

    async def kill(self) -> None:
        """SIGKILL every process of CMD's tree, the shim included, and return once none is alive.

        Killing goes on (and an error is logged every :data:`KILL_WAIT` seconds) for as long as one lives: a
        process in uninterruptible sleep dies only when it wakes, and until then the lock is kept.
        """
        self._note_zombie()
        found = self.members()
        self.signal(signal.SIGKILL)
        self._send("kill")
        waited = 0.0
        while True:
            if self.cgroup is not None:
                self.cgroup.kill()
            members = self.members()
            for pid in members:
                signal_process(pid, signal.SIGKILL)
            left = [pid for pid, _ in strays(self._started)[0]] if not _starting else []
            kill_sessions([*members, *left])  # a pid that hops is caught through its process group
            if await self.gone(KILL_WAIT if waited else _POLL * 5):
                break
            waited += KILL_WAIT
            log.error(
                "processes of CMD's tree survived SIGKILL for %gs: %s; the lock is kept until they are gone",
                waited,
                self.describe(self.members()),
            )
        if found:
            log.warning("killed CMD's tree with SIGKILL: %s", self.describe(found))

    async def terminate(self, grace: float) -> None:
        """SIGTERM each process of CMD's tree once, SIGCONT the stopped ones (the shim too), SIGKILL all after
        ``grace`` seconds; return once none is alive."""
        found = self.members()
        termed = self._signal_each(signal.SIGTERM, found)
        stopped = [pid for pid, fields in found.items() if fields[1] == "T"]
        for pid in stopped:  # a stopped process handles SIGTERM only once continued; a stopped shim can't reap
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        log.info(
            "stopping CMD's tree: SIGTERM to %s%s",
            self.describe({pid: found[pid] for pid in termed}),
            f"; SIGCONT to the stopped {', '.join(map(str, stopped))}" if stopped else "",
        )
        if await self.gone(grace):
            log.info("CMD's tree is gone")
            return
        log.warning(
            "CMD's processes still running %gs after SIGTERM: %s: sending SIGKILL", grace, self.describe(self.members())
        )
        await self.kill()

    async def aclose(self) -> None:
        """Close the line to the shim and return once no process of CMD's tree, the shim included, is alive.

        The shim kills whatever is left when the line closes; a shim that does not exit (stopped, traced)
        is killed with what is left, and so is what a dead shim left to this process. Then the cgroup is
        removed and, with no shim left, this process stops being a child subreaper.
        """
        self._closing = True
        self._watching.cancel()
        self._writer.close()
        with anyio.CancelScope(shield=True):
            shim = self.members().get(self.process.pid)
            if shim is not None and shim[1] == "T":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, signal.SIGCONT)
            if not await self.gone(KILL_WAIT / 4):
                await self.kill()
            with anyio.move_on_after(KILL_WAIT):
                await asyncio.shield(self._shim_exited)
                await asyncio.shield(self._reading)
            self._reap_strays()
            if self.cgroup is not None:
                with anyio.move_on_after(KILL_WAIT):
                    while not self.cgroup.remove():  # noqa: ASYNC110 - empty, but the kernel may lag a moment
                        await anyio.sleep(_POLL)
        if not _SHIMS and _prctl is not None:
            _prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
