"""The processes ``aioelect run`` inherits: orphans reaped as PID 1, strays of a killed shim found.

Every function here acts only on this process's children that are not
shims (:data:`SHIMS`, which asyncio waits for), so a program embedding the
command line keeps its own children.
"""

from __future__ import annotations

import contextlib
import os

import anyio

from ..core._tasks import TaskSet, consume
from ._shim import descendants, processes

__all__ = ["KILL_WAIT", "SHIMS", "STATES", "reap", "reap_orphans", "reaper", "start_time", "stat", "strays"]

#: How long processes killed with SIGKILL get to be gone.
KILL_WAIT = 2.0

#: The states of /proc/PID/stat, as the log names them.
STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible sleep",
    "T": "stopped",
    "t": "traced",
    "Z": "zombie",
    "Z+": "main thread ended, other threads running",
    "X": "dead",
    "I": "idle",
    "P": "parked",
}

#: The shims running now: :func:`reap_orphans` leaves them to asyncio.
SHIMS: set[int] = set()


def stat(pid: int) -> list[str] | None:
    """``[name, state, ppid, pgid, ...]`` of ``pid`` from /proc (the fields after the name); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            head, _, tail = fh.read().rpartition(b")")
    except OSError:
        return None
    name = head.split(b"(", 1)[-1].decode(errors="replace")
    return [name, *tail.decode(errors="replace").split()]


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def strays(since: int) -> tuple[list[tuple[int, bool]], list[int]]:
    """The descendants of this process under its children started at ``since`` or later that are not shims,
    as ``(pid, alive)``; and those children that are zombies (which this process reaps with :func:`reap`).

    They are what a dead shim left of CMD's tree: this process, a child subreaper while CMD runs, inherits it.
    """
    me = os.getpid()
    found: list[tuple[int, bool]] = []
    zombies: list[int] = []
    for pid, alive in descendants(me, depth=1):
        started = start_time(pid)
        if pid in SHIMS or started is None or started < since:
            continue
        found.append((pid, alive))
        found.extend(descendants(pid))
        if not alive:
            zombies.append(pid)
    return found, zombies


def reap(pid: int) -> int | None:
    """Reap ``pid``, a zombie child: its return code (-N for signal N); None if it is not waitable (yet)."""
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if reaped == pid else None


def _zombie_children() -> list[int]:
    me = str(os.getpid()).encode()
    return [pid for pid, fields in processes() if fields[0] == b"Z" and fields[1] == me]


def reaper() -> TaskSet:
    """A task set that reaps orphans (:func:`reap_orphans`) when this process is PID 1, else an empty one: its
    owner closes it (``await reaper.aclose()``) when it ends."""
    tasks = TaskSet()
    if os.getpid() == 1:
        tasks.start(reap_orphans(), name="aioelect-reap-orphans", on_done=consume)
    return tasks


async def reap_orphans(interval: float = 0.5) -> None:
    """Reap, every ``interval`` seconds, this process's zombie children that no one else waits for.

    For aioelect as PID 1, which the kernel hands every orphan of its PID
    namespace: without it they would stay zombies. Children asyncio waits
    for (the shims) are left to it. Runs until cancelled.
    """
    while True:
        for pid in _zombie_children():
            if pid not in SHIMS:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - a zombie: returns at once
        await anyio.sleep(interval)
