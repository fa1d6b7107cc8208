"""Candidate processes as the driver sees them: spawn, read their lines, command and signal them."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Bus", "CandidateProc", "Event", "Group", "now_ns"]

REPO = Path(__file__).resolve().parent.parent


def now_ns() -> int:
    """The clock candidates stamp their lines with (system-wide CLOCK_MONOTONIC)."""
    return time.monotonic_ns()


def _die_with_parent() -> None:
    # Candidates must not outlive a driver that is killed.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class Event:
    """One protocol line: ``kind`` printed by ``proc`` for ``slot`` at ``ns`` (candidate's clock)."""

    kind: str
    slot: int
    ns: int
    detail: str
    proc: CandidateProc


class Bus:
    """Every event of a group of candidate processes, in arrival order."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._changed = asyncio.Event()

    def push(self, event: Event) -> None:
        self.events.append(event)
        self._changed.set()

    async def wait_for(self, match: Callable[[Event], bool], timeout: float, start: int = 0) -> Event | None:
        """The first event from index ``start`` on that matches, waiting at most ``timeout`` s; None on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        i = start
        while True:
            while i < len(self.events):
                event = self.events[i]
                i += 1
                if match(event):
                    return event
            left = deadline - loop.time()
            if left <= 0:
                return None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    def mark(self) -> int:
        """An index for :meth:`wait_for` that skips every event seen so far."""
        return len(self.events)


class CandidateProc:
    """One candidate OS process (``python -m bench.candidates.<module>``), hosting one or more slots."""

    def __init__(self, module: str, label: str, bus: Bus, log_dir: Path) -> None:
        self.module = module
        self.label = label
        self.bus = bus
        self.log_path = log_dir / f"{label}.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.pids: dict[int, int] = {}
        self.exited = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<CandidateProc {self.label} pid={self.pid}>"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    async def start(self, args: Sequence[str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                f"bench.candidates.{self.module}",
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                cwd=REPO,
                start_new_session=True,  # its own process group: cleanup reaches etcdctl children too
                preexec_fn=_die_with_parent,
                limit=1 << 20,
            )
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                parts = line.decode(errors="replace").rstrip("\n").split(" ", 3)
                if len(parts) < 3 or not parts[2].isdigit():
                    continue
                kind, slot, ns = parts[0], int(parts[1]), int(parts[2])
                detail = parts[3] if len(parts) > 3 else ""
                if kind == "PID" and detail.isdigit():
                    self.pids[slot] = int(detail)
                self.bus.push(Event(kind, slot, ns, detail, self))
        finally:
            self.exited.set()
            self.bus.push(Event("EXITED", -1, now_ns(), "", self))

    def send(self, command: str) -> None:
        """Write one command line; a process that is gone is ignored."""
        if self.proc is None or self.proc.stdin is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            self.proc.stdin.write(command.encode() + b"\n")

    def target_pid(self, slot: int = 0) -> int:
        """The pid that stands for ``slot`` when crashing or freezing it."""
        return self.pids.get(slot, self.pid)

    def signal(self, sig: int, slot: int = 0) -> int:
        """Send ``sig`` to the slot's process; return the driver's clock just before."""
        t = now_ns()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.target_pid(slot), sig)
        return t

    def kill_tree(self) -> None:
        """SIGKILL the whole process group at once (frozen members included)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def close(self, grace: float = 0.0) -> None:
        """Ask it to quit (if ``grace``), then kill its whole group and reap it. Bounded."""
        if self.proc is None:
            return
        if grace > 0 and self.proc.returncode is None:
            self.send("quit")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), grace)
        self.kill_tree()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), 10.0)
        if self._reader is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._reader, 5.0)


class Group:
    """Candidate processes of one implementation in one election (one name)."""

    def __init__(self, module: str, name: str, base_args: Sequence[str], log_dir: Path, label: str) -> None:
        self.module = module
        self.name = name
        self.base_args = list(base_args)
        self.log_dir = log_dir
        self.label = label
        self.bus = Bus()
        self.procs: list[CandidateProc] = []

    async def spawn(self, *, slots: int = 1, extra: Sequence[str] = ()) -> CandidateProc:
        proc = CandidateProc(self.module, f"{self.label}-{len(self.procs)}", self.bus, self.log_dir)
        self.procs.append(proc)
        await proc.start([*self.base_args, "--name", self.name, "--slots", str(slots), *extra])
        return proc

    def campaigning(self, proc: CandidateProc) -> int:
        """How many slots of ``proc`` have printed CAMPAIGN."""
        return len({e.slot for e in self.bus.events if e.proc is proc and e.kind == "CAMPAIGN"})

    async def wait_campaigning(self, proc: CandidateProc, slots: int, timeout: float) -> bool:
        """Wait until ``slots`` slots of ``proc`` campaign (or lead); False on timeout or error."""
        seen: set[int] = set()

        def match(e: Event) -> bool:
            if e.proc is proc and e.kind in ("CAMPAIGN", "LEADER"):
                seen.add(e.slot)
            return len(seen) >= slots or (e.proc is proc and e.kind in ("ERROR", "EXITED"))

        event = await self.bus.wait_for(match, timeout)
        return event is not None and len(seen) >= slots

    def leader(self) -> Event | None:
        """The LEADER event of the slot that leads now, as far as the lines tell, or None."""
        current: dict[tuple[int, int], Event] = {}
        for e in self.bus.events:
            key = (id(e.proc), e.slot)
            if e.kind == "LEADER":
                current[key] = e
            elif e.kind in ("RELEASING", "STOPPED", "CAMPAIGN"):
                current.pop(key, None)
            elif e.kind == "EXITED":
                for k in [k for k in current if k[0] == id(e.proc)]:
                    current.pop(k)
        if not current:
            return None
        return max(current.values(), key=lambda e: e.ns)

    async def wait_leader(self, timeout: float) -> Event | None:
        """The current leader, waiting up to ``timeout`` s for one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            lead = self.leader()
            if lead is not None:
                return lead
            left = deadline - loop.time()
            if left <= 0:
                return None
            await self.bus.wait_for(lambda e: e.kind == "LEADER", left, start=self.bus.mark())

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self.procs), return_exceptions=True)
