"""Stopped processes under the adversary: ``aioelect run`` supervisors whose every process is SIGSTOPped.

Several ``aioelect run --forever`` processes (2 to 4, drawn by the seed)
campaign on one real server, each with CMD :mod:`~.stop_cmd`: CMD starts a
worker in its process group and one in a session of its own (``setsid``),
may stop its own shim (``kill -STOP $PPID``) and may exit by itself; every
process of the tree writes heartbeats. Meanwhile:

* the **stopper** SIGSTOPs, every 0.2-1 s, one process we own, drawn among
  a supervisor (the elector's process), its shim, CMD, the worker and the
  setsid worker, for 0.05-3 s (a supervisor up to 4.5 s: past the lease),
  then SIGCONTs it;
* the **operator** deposes the leader every 0.5-2.5 s (etcd: revokes the
  lease of the first key; MySQL and PostgreSQL: ends the holder's
  session), and, nine times in ten, 0.1-1 s after a CMD stopped its shim
  (it reads the heartbeats), so that a loss meets a stopped shim.

The checker (:func:`judge`) reads the heartbeats: a tree worked from its
first to its last heartbeat. No two trees may work at once beyond the
margin (the backend's bound for a deposed leader to notice, plus ``--grace``
and the kill): a worker of a deposed leader still beating after the next
leader's CMD started is an **overlap**. The time the earlier tree's
supervisor was stopped, and the margin after it woke, do not count: a
stopped ``aioelect`` stops nothing (docs/security.md), the fencing token is
the protection there. Tokens must grow (**token**), and nothing of any tree
may be alive once every supervisor has exited after SIGTERM (**leftover**).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from soak.checker import Fault, Term, Verdict, Violation, covered, stopped
from soak.timing import OVERLAP_SLACK, confirmation_gap
from tests.harness.processes import popen

from .run import Outcome, _Trace, tokens
from .servers import Target

__all__ = ["GRACE", "STOP_BACKENDS", "Beats", "BeatsReader", "judge", "read_beats", "run_stops", "stop_margin"]

_NS = 1_000_000_000
_CMD = Path(__file__).resolve().parent / "stop_cmd.py"
#: ``aioelect run --grace``: at most the safety margin (1 s on etcd with --ttl 3, SQL with --lease 3) less 0.5 s.
GRACE = 0.5
#: The kill after the grace, and the release, on a loaded machine.
_KILL = 0.5
_TTL = 3
#: How long a supervisor may take to exit after SIGTERM (it ends its tree first, within ``--grace``).
_EXIT = 6.0
_SQL = {"lease": 3.0, "check_interval": 0.3, "check_timeout": 0.6}
#: The backends the workload runs on.
STOP_BACKENDS = ("etcd", "mysql", "postgres")
#: The processes the stopper draws from, with their weights.
ROLES = {"supervisor": 1.0, "shim": 1.5, "cmd": 1.5, "child": 1.0, "setsid": 1.0}


def stop_margin(backend: str) -> float:
    """Seconds two trees may both work: a deposed leader notices (etcd: ``ttl/3``; SQL: ``check_interval + 2 x
    check_timeout``), plus scheduling, ``--grace`` and the kill."""
    notice = _TTL / 3 if backend == "etcd" else confirmation_gap(_SQL["check_interval"], _SQL["check_timeout"])
    return notice + OVERLAP_SLACK + GRACE + _KILL


def _backend_args(target: Target) -> list[str]:
    if target.backend == "etcd":
        return ["--etcd", ",".join(target.target()), "--ttl", str(_TTL)]
    args = [f"--{target.backend}", str(target.target())]
    return args + [f"--{k.replace('_', '-')}={v}" for k, v in _SQL.items()] + ["--renew-deadline=2"]


@dataclass
class Beats:
    """One process of a tree, by its heartbeats."""

    who: str
    token: int
    role: str
    pid: int
    ppid: int
    first: int
    last: int
    count: int = 0
    #: CMD stopped its shim (pid) at this time.
    stopped_shim: tuple[int, int] | None = None


class BeatsReader:
    """The heartbeats of a directory, read on from where the last call stopped (a long run's files grow)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._offsets: dict[Path, int] = {}
        self._beats: dict[Path, Beats] = {}

    def read(self) -> list[Beats]:
        """Every process's heartbeats so far (a line not yet complete waits for the next call)."""
        for path in sorted(self.directory.glob("*.jsonl")):
            with open(path, "rb") as fh:
                fh.seek(self._offsets.get(path, 0))
                data = fh.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                try:
                    fields = json.loads(line)
                except ValueError:
                    continue
                beats = self._beats.get(path)
                if beats is None:
                    beats = self._beats[path] = Beats(fields["who"], fields["token"], fields["role"], fields["pid"],
                                                      fields["ppid"], fields["t"], fields["t"])  # fmt: skip
                beats.last = max(beats.last, fields["t"])
                beats.count += 1
                if fields.get("e") == "stop-shim":
                    beats.stopped_shim = (fields["shim"], fields["t"])
        return list(self._beats.values())


def read_beats(directory: Path) -> list[Beats]:
    """Every process's heartbeats in ``directory`` (a line cut short by a kill is left out)."""
    return BeatsReader(directory).read()


def judge(beats: list[Beats], faults: list[Fault], margin: float) -> tuple[list[Violation], list[Term], float]:
    """Trees that worked on after the next tree's CMD started, beyond ``margin`` s (the time the earlier tree's
    supervisor was stopped not counted: once woken it has ``margin`` to end its tree); tokens that do not grow.
    Also the trees as terms (``who`` the supervisor, the token, first and last heartbeat) and the longest such
    time (s)."""
    trees: dict[tuple[str, int], list[Beats]] = {}
    for b in beats:
        trees.setdefault((b.who, b.token), []).append(b)
    terms = sorted(
        (Term(who, token, min(b.first for b in own), max(b.last for b in own), sum(b.count for b in own))
         for (who, token), own in trees.items()),
        key=lambda t: (t.start, t.who),
    )  # fmt: skip
    stops = stopped(faults, "stop-supervisor")
    m = int(margin * _NS)
    found: list[Violation] = []
    worst = 0
    for i, earlier in enumerate(terms):
        later = next((t for t in terms[i + 1 :] if t.start > earlier.start), None)
        if later is None or earlier.end <= later.start:
            continue
        a = later.start
        # A stopped supervisor ends nothing; once woken it has the margin, allowed below.
        overlap = earlier.end - a - covered(stops.get(earlier.who, []), a, earlier.end)
        worst = max(worst, overlap)
        if overlap <= m:
            continue
        late = [x for x in trees[(earlier.who, earlier.token)] if x.last > a + m]
        what = ", ".join(f"its {x.role} (pid {x.pid}) for {(x.last - a) / _NS:.2f} s" for x in late)
        found.append(
            Violation(
                "overlap",
                f"{earlier.who}'s tree (token {earlier.token}) worked for {overlap / _NS:.2f} s after "
                f"{later.who}'s CMD (token {later.token}) started (margin {margin:.2f} s): {what}",
                a,
            )
        )
    return found + tokens(terms, margin), terms, worst / _NS


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (or traced) now."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def _ours(pid: int) -> bool:
    """Whether ``pid`` is a process of a tree (CMD, a worker) or a shim: never signal a pid reused by another."""
    line = _cmdline(pid)
    return b"stop_cmd.py" in line or b"_shim.py" in line


class _Supervisor:
    def __init__(self, who: str, proc: subprocess.Popen[bytes]) -> None:
        self.who = who
        self.proc = proc
        self.shims: set[int] = set()

    def shim(self) -> int | None:
        """The shim between this supervisor and its CMD now, if any."""
        for pid in _children(self.proc.pid):
            if b"_shim.py" in _cmdline(pid):
                self.shims.add(pid)
                return pid
        return None


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children", "rb") as fh:
                found += [int(c) for c in fh.read().split()]
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class _Run:
    def __init__(self, target: Target, seed: int, directory: Path, trace: _Trace) -> None:
        self.target, self.seed, self.directory, self.trace = target, seed, directory, trace
        self.supervisors: list[_Supervisor] = []
        self.beats = BeatsReader(directory)
        self.faults: list[Fault] = []
        self.errors: list[str] = []

    def start(self, who: str, rng: random.Random) -> None:
        argv = [sys.executable, "-m", "aioelect", "run", *_backend_args(self.target), "--name", self.target.name,
                "--identity", who, "--forever", "--restart-delay", f"{rng.uniform(0.1, 1.0):.2f}",
                "--grace", str(GRACE), "--", sys.executable, "-I", "-S", str(_CMD), str(self.directory),
                str(self.seed)]  # fmt: skip
        proc = popen(argv, log_path=str(self.directory / f"{who}.log"), env=dict(os.environ), cwd=os.getcwd())
        self.supervisors.append(_Supervisor(who, proc))

    def _current(self, supervisor: _Supervisor) -> dict[str, int]:
        """The live processes of ``supervisor``'s newest tree, by role."""
        newest: dict[str, Beats] = {}
        for b in self.beats.read():
            if b.who == supervisor.who and (b.role not in newest or b.first > newest[b.role].first):
                newest[b.role] = b
        return {role: b.pid for role, b in newest.items() if _ours(b.pid)}

    async def stop(self, rng: random.Random) -> None:
        """SIGSTOP one process we own, drawn by ``rng``, for a drawn time; then SIGCONT it."""
        supervisor = rng.choice(self.supervisors)
        role = rng.choices(list(ROLES), list(ROLES.values()))[0]
        seconds = rng.uniform(0.1, 4.5) if role == "supervisor" else rng.uniform(0.05, 3.0)
        if role == "supervisor":
            pid = supervisor.proc.pid if supervisor.proc.poll() is None else None
        elif role == "shim":
            pid = supervisor.shim()
        else:
            pid = self._current(supervisor).get(role)
        if pid is None or _stopped(pid):  # one CMD stopped stays so: the stopper continues only what it stopped
            self.trace.sink("stopper")(f"stop-{role} of {supervisor.who}: {'already stopped' if pid else 'none'}")
            return
        start = time.monotonic_ns()
        _signal(pid, signal.SIGSTOP)
        self.trace.sink("stopper")(f"SIGSTOP {role} of {supervisor.who} (pid {pid}) for {seconds:.2f} s")
        try:
            await anyio.sleep(seconds)
        finally:
            if role == "supervisor" or _ours(pid):
                _signal(pid, signal.SIGCONT)
        heal = time.monotonic_ns()
        self.faults.append(Fault(f"stop-{role}", supervisor.who, start, heal, heal, f"pid {pid}", supervisor.who))

    async def depose(self) -> None:
        start = time.monotonic_ns()
        try:
            detail = await _depose(self.target)
        except Exception as exc:
            self.errors.append(f"depose failed: {exc!r}")
            return
        heal = time.monotonic_ns()
        self.trace.sink("operator")(f"depose: {detail}")
        self.faults.append(Fault("depose", self.target.backend, start, heal, heal, detail))

    async def react(self, rng: random.Random, until: float) -> None:
        """Depose the leader soon after a CMD stops its shim (most often): the loss must end the tree all the same."""
        seen: set[int] = set()
        async with anyio.create_task_group() as tg:
            while time.monotonic() < until:
                await anyio.sleep(0.1)
                for b in self.beats.read():
                    if b.stopped_shim is None or b.pid in seen:
                        continue
                    seen.add(b.pid)
                    if rng.random() < 0.9:
                        tg.start_soon(self._depose_after, rng.uniform(0.1, 1.0), b.who)

    async def _depose_after(self, seconds: float, who: str) -> None:
        await anyio.sleep(seconds)
        self.trace.sink("operator")(f"reacts to {who}'s stopped shim")
        await self.depose()

    def every_pid(self) -> set[int]:
        """Every process of every tree and every shim seen (the ones still ours)."""
        pids = {b.pid for b in self.beats.read()} | {p for s in self.supervisors for p in s.shims}
        return {pid for pid in pids if _ours(pid)}

    async def finish(self) -> list[str]:
        """SIGTERM every supervisor (each woken first) and wait for it; what is left of a tree, as sentences."""
        for s in self.supervisors:
            _signal(s.proc.pid, signal.SIGCONT)
            _signal(s.proc.pid, signal.SIGTERM)
        left: list[str] = []
        deadline = time.monotonic() + _EXIT
        for s in self.supervisors:
            while s.proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 (a process, no event)
                await anyio.sleep(0.05)
            if s.proc.poll() is None:
                left.append(f"{s.who} did not exit within {_EXIT:g} s of SIGTERM")
                _signal(s.proc.pid, signal.SIGKILL)
                await anyio.to_thread.run_sync(s.proc.wait)
        await anyio.sleep(0.2)  # a shim SIGKILLed with its supervisor ends its tree at once
        alive = sorted(self.every_pid())
        if alive:
            roles = {b.pid: f"{b.who}'s {b.role}" for b in self.beats.read()}
            named = ", ".join(f"{roles.get(pid, 'a shim')} (pid {pid})" for pid in alive)
            left.append(f"alive after every supervisor exited: {named}")
        for pid in alive:  # the cleanup of last resort
            _signal(pid, signal.SIGCONT)
            _signal(pid, signal.SIGKILL)
        return left


async def _depose(target: Target) -> str:
    """End the leader's hold from the server: etcd revokes the first key's lease; SQL ends the holder's session."""
    if target.backend == "etcd":
        keys = await target.keys()  # type: ignore[attr-defined]
        if not keys:
            return "no key"
        lease = int(keys[0].get("lease", 0))
        try:
            await target._etcdctl("lease", "revoke", f"{lease:x}")  # type: ignore[attr-defined]
        except subprocess.CalledProcessError as exc:
            if "lease not found" not in str(exc.stderr):
                raise
            return f"lease {lease:x} already gone"
        return f"lease revoke {lease:x} (the leader's)"
    return await target.act("kill-holder", random.Random(0))


async def _every(low: float, high: float, until: float, rng: random.Random, action: Any) -> None:
    async with anyio.create_task_group() as tg:
        while True:
            await anyio.sleep(rng.uniform(low, high))
            if time.monotonic() >= until:
                return
            tg.start_soon(action)


async def run_stops(target: Target, seed: int, seconds: float, *, supervisors: int | None = None) -> Outcome:
    """Run ``aioelect run`` supervisors against ``target`` for ``seconds`` under seed ``seed``, stopping and
    continuing their processes; judge the trees' heartbeats."""
    master = random.Random(seed)
    count = supervisors or master.randint(2, 4)
    directory = Path(tempfile.mkdtemp(prefix=f"aioelect-stops-{seed}-"))
    trace = _Trace()
    run = _Run(target, seed, directory, trace)
    stop_rng, operator_rng = random.Random(master.getrandbits(64)), random.Random(master.getrandbits(64))
    react_rng = random.Random(master.getrandbits(64))
    for i in range(count):
        run.start(f"s{i}", random.Random(master.getrandbits(64)))
    until = time.monotonic() + seconds
    left: list[str] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_every, 0.2, 1.0, until, stop_rng, lambda: run.stop(stop_rng))
            tg.start_soon(_every, 0.5, 2.5, until, operator_rng, run.depose)
            tg.start_soon(run.react, react_rng, until)
    finally:
        with anyio.CancelScope(shield=True):
            left = await run.finish()
    end = time.monotonic_ns()
    beats = read_beats(directory)
    bound = stop_margin(target.backend)
    violations, terms, worst = judge(beats, run.faults, bound)
    violations += [Violation("leftover", item) for item in left] + [Violation("error", e) for e in run.errors]
    for term in terms:
        trace.lines.append((term.start, term.who, f"CMD starts, token {term.token}"))
        trace.lines.append((term.end, term.who, f"the tree's last heartbeat, token {term.token}"))
    counts: dict[str, int] = {"leadership": len(terms)}
    for b in beats:
        if b.stopped_shim is not None:
            counts["cmd stops its shim"] = counts.get("cmd stops its shim", 0) + 1
            trace.lines.append((b.stopped_shim[1], b.who, f"CMD stops its shim (pid {b.stopped_shim[0]})"))
    for f in run.faults:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    trace.lines.sort()
    label = f"{target.backend} stops seed {seed}"
    verdict = Verdict(label, violations, terms, {}, 0, 0, 0, 0.0, 0.0, worst, bound)
    if violations:
        trace.lines.append((end, "run", f"heartbeats and supervisor logs kept in {directory}"))
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return Outcome(f"{target.backend} stops", seed, verdict, run.faults, [], counts, trace.lines)
