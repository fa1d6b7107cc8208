"""A cgroup v2 of its own for one CMD's tree: every process in it found and killed at once, whatever it did.

A process cannot leave a cgroup by forking, double-forking, starting a
session or being stopped or traced; ``cgroup.kill`` (Linux 5.14+) SIGKILLs
every member at once, forks racing with it included, and ``cgroup.events``
says ``populated 0`` once none is left (a zombie does not count: it has
closed every descriptor, the lock's included). Only root, or a user the
cgroup is delegated to, can leave a cgroup by writing ``cgroup.procs``:
the supervisor's subreaper keeps following such a process.

Guarantees:

* :func:`create` makes an empty cgroup under this process's own cgroup v2
  (found through ``/proc/self/cgroup`` and ``/proc/self/mountinfo``), or
  says why it cannot (no cgroup v2, not writable);
* :meth:`Cgroup.kill` SIGKILLs every member (``cgroup.kill``; where that is
  missing, each member found in ``cgroup.procs``, as often as it is called);
* :meth:`Cgroup.remove` removes the cgroup once it is empty.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import secrets
import signal
import time

__all__ = ["Cgroup", "Containment", "cgroup_of", "create"]

log = logging.getLogger("aioelect.cli")

#: Prefix of the cgroups made here: ``aioelect-PID-N-RANDOM``, PID the supervisor's (in its PID namespace).
PREFIX = "aioelect-"
#: A cgroup this recent is never taken for a stale one: its supervisor may live in another PID namespace.
STALE_AFTER = 300.0
_serial = itertools.count(1)


def _own_path() -> str:
    """This process's cgroup v2 directory; OSError if there is none."""
    with open("/proc/self/cgroup") as fh:
        relative = next((line[3:].strip() for line in fh if line.startswith("0::")), None)
    if relative is None:
        raise OSError(errno.ENOENT, "no cgroup v2 hierarchy in /proc/self/cgroup")
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] != "cgroup2":
                continue
            root, point = fields[3], fields[4]
            if relative == root or relative.startswith(root.rstrip("/") + "/"):
                return os.path.join(point, relative[len(root) :].lstrip("/"))
    raise OSError(errno.ENOENT, "cgroup v2 is not mounted where this process can see its own cgroup")


def _remove_stale(parent: str) -> None:
    """Remove the empty cgroups a SIGKILLed supervisor left behind (their supervisor is gone)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(parent):
            owner = entry[len(PREFIX) :].split("-", 1)[0]
            if not entry.startswith(PREFIX) or not owner.isdigit() or os.path.exists(f"/proc/{owner}"):
                continue
            path = os.path.join(parent, entry)
            with contextlib.suppress(OSError):
                if time.time() - os.stat(path).st_mtime > STALE_AFTER:
                    os.rmdir(path)  # fails while populated: then it is left alone


class Cgroup:
    """One cgroup v2 directory, made for one CMD's tree."""

    def __init__(self, path: str) -> None:
        #: The cgroup's directory.
        self.path = path
        #: Whether ``cgroup.kill`` exists (Linux 5.14+).
        self.killable = os.path.exists(os.path.join(path, "cgroup.kill"))

    def procs(self) -> list[int]:
        """The processes in the cgroup now (zombies excluded); [] once it is removed."""
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as fh:
                return [int(pid) for pid in fh.read().split()]
        except FileNotFoundError:
            return []

    def populated(self) -> bool:
        """Whether a live process is in the cgroup (``cgroup.events``)."""
        try:
            with open(os.path.join(self.path, "cgroup.events")) as fh:
                return "populated 1" in fh.read()
        except FileNotFoundError:
            return False

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (at once through ``cgroup.kill``, else one by one)."""
        if self.killable:
            try:
                with open(os.path.join(self.path, "cgroup.kill"), "w") as fh:
                    fh.write("1")
                return
            except OSError:
                pass
        for pid in self.procs():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> bool:
        """Remove the cgroup; False while a process is still in it."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


def create() -> Cgroup | OSError:
    """An empty cgroup of its own under this process's cgroup v2, or the OSError that prevents it."""
    try:
        parent = _own_path()
        _remove_stale(parent)
        path = os.path.join(parent, f"{PREFIX}{os.getpid()}-{next(_serial)}-{secrets.token_hex(3)}")
        os.mkdir(path, 0o755)
    except OSError as exc:
        return exc
    if not os.path.exists(os.path.join(path, "cgroup.procs")):  # a plain directory: something hides cgroup2 there
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return OSError(errno.ENOTSUP, f"{parent} is not a cgroup v2 directory")
    return Cgroup(path)


def cgroup_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            return next((line[3:].strip() for line in fh if line.startswith("0::")), None)
    except OSError:
        return None


class Containment:
    """How CMD's trees are contained here, said in the log at the first CMD and whenever it changes."""

    said: bool | None = None

    @classmethod
    def say(cls, cgroup: Cgroup | None, reason: str) -> None:
        if cls.said is (cgroup is not None):
            return
        cls.said = cgroup is not None
        if cgroup is not None:
            how = "cgroup.kill" if cgroup.killable else "SIGKILL to each member (no cgroup.kill before Linux 5.14)"
            log.info(
                "containment: each CMD's tree runs in a cgroup v2 of its own (%s), ended with %s and waited for until "
                "it is empty before the lock is released; a child subreaper follows processes moved out of it",
                os.path.dirname(cgroup.path),
                how,
            )
        else:
            log.warning(
                "containment: no writable cgroup v2 here (%s): CMD's tree is followed through a child subreaper "
                "only (processes found in /proc and killed one by one until none is left)",
                reason,
            )
