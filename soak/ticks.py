"""Kleppmann's scenario, soaked: ticks recorded in fenced state while leaders are released, killed and frozen.

``python -m soak.ticks --backend redis --seconds 60`` starts a throwaway
server (tests/harness) unless ``--target`` names one, then three worker
processes (``python -m soak.ticks worker``) that campaign for one election
and run the ticks of one job (:class:`aioelect.integrations.schedule.Ticks`,
``run_once``). Each run of a tick sleeps (the job's work), checks its
leadership, and then sends a fenced write (key ``out/{tick}``) -- the write
in flight. A nemesis picks the leader every few seconds and

* ``release``: asks it to release (SIGUSR2);
* ``kill``: SIGKILL, and starts it again;
* ``freeze``: asks it (SIGUSR1) to stop itself with SIGSTOP right after its
  next ``check()`` passed, before its write is sent; it is resumed
  (SIGCONT) after twice the lease, with its write in flight (Kleppmann's GC
  pause);
* ``stop``: SIGSTOP at any moment (mid-job, mid-record), resumed after twice
  the lease.

The checker reads the workers' event lines (one file, appended, so in the
order they happened) and counts duplicate ticks (a tick run twice: goal 0),
lost ticks (a tick no run stands for: goal 0 with ``run_once``) apart from
dropped ones (recorded by a leader that was then killed or stopped before
its job began: ``Ticks`` is at most once for a job outside the record's
transaction, as docs/exactly-once.md says), and late
writes (a write sent after a newer token ran a tick) and how many of them
the fence refused (goal: all). The file backend has no lease: a frozen
leader keeps its lock, so nobody overtakes it and it has no late write.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Elector options per backend: a short lease so that a frozen leader is overtaken in a few seconds.
OPTIONS: dict[str, dict[str, Any]] = {
    "redis": {"lease": 3, "check_interval": 0.2, "poll_interval": 0.3},
    "etcd": {"ttl": 2, "degrade_to_local": False},
    "mysql": {"fencing": True, "lease": 2, "check_interval": 0.2, "poll_interval": 0.3},
    "postgres": {"fencing": True, "schema": "public", "lease": 2, "check_interval": 0.2, "poll_interval": 0.3},
    "file": {"check_interval": 0.2},
}
#: How long a frozen or stopped worker stays stopped: more than a lease, so that another takes over.
FREEZE = 6.0
PERIOD = 0.5
JOB = 0.2


# --- the worker ---------------------------------------------------------------------------------


async def worker(args: argparse.Namespace) -> None:
    import anyio

    import aioelect
    from aioelect.core._values import encode
    from aioelect.integrations.schedule import Every, Tick, Ticks

    out = open(args.events, "a", encoding="utf-8")  # noqa: ASYNC230, SIM115 (once, before anything runs)

    def emit(event: str, **fields: Any) -> None:
        out.write(json.dumps({"e": event, "who": args.identity, "pid": os.getpid(), **fields}) + "\n")
        out.flush()

    freeze = False
    scope: anyio.CancelScope | None = None

    def on_freeze() -> None:
        nonlocal freeze
        freeze = True

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, on_freeze)

    def on_release() -> None:
        if scope is not None:
            scope.cancel()

    loop.add_signal_handler(signal.SIGUSR2, on_release)
    stop = anyio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    ticks = Ticks("soak", Every(args.period))
    emit("start")

    async with aioelect.new(
        **{args.backend: args.target}, name=args.name, identity=args.identity, **json.loads(args.options)
    ) as elector:
        store = ticks.store(elector)
        record = store.compare_and_set

        async def recording(lead: Any, key: str, expected: Any, value: Any) -> bool:
            # Sent before the record: a worker killed or stopped between the record and its job leaves this
            # behind, and the checker tells the ticks it dropped from lost ones.
            first = int(expected["tick"]) + 1 if isinstance(expected, dict) else int(value["tick"])
            emit("record", tick=value["tick"], first=first, token=lead.token)
            return await record(lead, key, expected, value)

        store.compare_and_set = recording  # type: ignore[method-assign]

        async def job(tick: Tick) -> None:
            nonlocal freeze
            lead = aioelect.current_leadership()
            emit("run", tick=tick.number, first=tick.first, token=tick.token)
            await anyio.sleep(args.job)
            lead.check()
            if freeze:
                freeze = False
                emit("freeze", tick=tick.number, token=tick.token)
                os.kill(os.getpid(), signal.SIGSTOP)  # the check passed; the write is about to be sent
            emit("send", tick=tick.number, token=tick.token)
            value = encode({"tick": tick.number, "token": tick.token})
            with anyio.CancelScope(shield=True):  # the server's answer, whatever happened to the leadership
                try:
                    key = f"out/{tick.number}"
                    result = (await store._store.write(lead._hold, key, value, compare=False, expected=None)).value
                except Exception as exc:  # a write cut short by the fault: neither accepted nor refused
                    result = f"error: {exc!r}"
            emit("write", tick=tick.number, token=tick.token, result=result)

        async def campaign() -> None:
            nonlocal scope
            while True:
                try:
                    async with aioelect.leadership(elector) as lead:
                        emit("lead", token=lead.token)
                        with anyio.CancelScope() as scope:  # SIGUSR2 cancels it: a release
                            await ticks.run(lead, job)
                    emit("released", token=lead.token)
                    await anyio.sleep(2)
                except (aioelect.LeadershipLost, aioelect.BackendUnavailable) as exc:
                    emit("lost", error=repr(exc))
                    await anyio.sleep(0.3)

        async with anyio.create_task_group() as tg:
            tg.start_soon(campaign)
            await stop.wait()
            tg.cancel_scope.cancel()
    emit("exit")


# --- the checker --------------------------------------------------------------------------------


@dataclass
class Figures:
    runs: int = 0
    ticks: int = 0
    duplicates: int = 0
    lost: int = 0
    #: Ticks a leader recorded and then died or was stopped before its job began: ``Ticks`` records a tick before
    #: its job runs (at most once, docs/exactly-once.md), so nobody runs them. Not lost ticks: those no record
    #: stands for either.
    dropped: int = 0
    late_writes: int = 0
    late_refused: int = 0
    late_accepted: int = 0
    #: Late writes that failed (the frozen leader's connection ended meanwhile), by tick and token: whether
    #: their value is in the store afterwards is checked by :meth:`Soak.unwritten`.
    late_failed: list[tuple[int, int]] = field(default_factory=list)
    #: Of those, the ones whose value is in the store (written after all).
    late_failed_written: int = 0
    #: What the failed late writes said (distinct, shortened).
    late_errors: set[str] = field(default_factory=set)
    writes: int = 0
    faults: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.runs > 0
            and self.duplicates == 0
            and self.lost == 0
            and self.late_accepted == 0
            and self.late_failed_written == 0
        )


def check(events: list[dict[str, Any]]) -> Figures:
    """Count duplicate and lost ticks, and late writes (and their refusals), in the order the events happened."""
    figures = Figures()
    covered: dict[int, int] = {}
    #: Per worker, the ticks of its last record not yet run, while that worker is killed or stopped next.
    pending: dict[str, range] = {}
    recorded_unrun: set[int] = set()
    newest = 0  # the newest token that has run a tick so far
    for event in events:
        if event["e"] == "record":
            pending[event["who"]] = range(event["first"], event["tick"] + 1)
        elif event["e"] == "fault" and event["kind"] in ("kill", "stop"):
            recorded_unrun.update(pending.pop(event["who"], range(0)))
        if event["e"] == "run":
            pending.pop(event["who"], None)
            figures.runs += 1
            newest = max(newest, event["token"])
            for number in range(event["first"], event["tick"] + 1):
                covered[number] = covered.get(number, 0) + 1
        elif event["e"] == "send":
            event["late"] = newest > event["token"]
        elif event["e"] == "write":
            figures.writes += 1
        elif event["e"] == "fault":
            figures.faults[event["kind"]] = figures.faults.get(event["kind"], 0) + 1
    # A write's lateness is decided when it is sent: pair each write with its worker's last send.
    last_send: dict[tuple[str, int], bool] = {}
    for event in events:
        if event["e"] == "send":
            last_send[(event["who"], event["tick"])] = event["late"]
        elif event["e"] == "write" and last_send.get((event["who"], event["tick"])):
            figures.late_writes += 1
            if event["result"] == "fenced":
                figures.late_refused += 1
            elif event["result"] == "done":
                figures.late_accepted += 1
            else:
                figures.late_failed.append((event["tick"], event["token"]))
                figures.late_errors.add(event["result"][:120])
    if covered:
        figures.ticks = len(covered)
        figures.duplicates = sum(n - 1 for n in covered.values())
        missing = [n for n in range(min(covered), max(covered) + 1) if n not in covered]
        figures.dropped = sum(1 for n in missing if n in recorded_unrun)
        figures.lost = len(missing) - figures.dropped
    return figures


# --- the runner and its nemesis --------------------------------------------------------------------


class Soak:
    def __init__(self, backend: str, target: str, workdir: Path, seed: int, options: dict[str, Any]) -> None:
        self.backend, self.target, self.workdir = backend, target, workdir
        self.events = workdir / "events.jsonl"
        self.events.touch()
        self.rng = random.Random(seed)
        self.name = f"/soak-ticks/{seed}" if backend == "etcd" else f"soak-ticks-{seed}"
        self.options = options
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: The faults the nemesis picks from.
        self.kinds = ["release", "kill", "freeze", "freeze", "stop"]

    def spawn(self, identity: str) -> None:
        argv = [sys.executable, "-m", "soak.ticks", "worker", "--backend", self.backend, "--target", self.target]
        argv += ["--name", self.name, "--identity", identity, "--options", json.dumps(self.options)]
        argv += ["--events", str(self.events), "--period", str(PERIOD), "--job", str(JOB)]
        log = open(self.workdir / f"{identity}.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.procs[identity] = subprocess.Popen(argv, stdout=log, stderr=log, cwd=Path(__file__).parent.parent)
        log.close()

    def note(self, kind: str, who: str) -> None:
        with self.events.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"e": "fault", "kind": kind, "who": who, "t": time.time()}) + "\n")

    def read(self) -> list[dict[str, Any]]:
        events = []
        for line in self.events.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events

    def leader(self) -> str | None:
        best: tuple[int, str] | None = None
        for event in self.read():
            if event["e"] == "lead" and (best is None or event["token"] > best[0]):
                best = (event["token"], event["who"])
        return None if best is None else best[1]

    def wait_for(self, what: str, who: str, since: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e["e"] == what and e["who"] == who for e in self.read()[since:]):
                return True
            time.sleep(0.05)
        return False

    def fault(self) -> None:
        who = self.leader()
        if who is None or who not in self.procs:
            return
        proc = self.procs[who]
        kind = self.rng.choice(self.kinds)
        self.note(kind, who)
        if kind == "release":
            proc.send_signal(signal.SIGUSR2)
        elif kind == "kill":
            proc.kill()
            proc.wait(10)
            time.sleep(0.5)
            self.spawn(who)
        elif kind == "freeze":
            since = len(self.read())
            proc.send_signal(signal.SIGUSR1)
            if self.wait_for("freeze", who, since, timeout=10):
                time.sleep(FREEZE)
            proc.send_signal(signal.SIGCONT)
        else:
            proc.send_signal(signal.SIGSTOP)
            time.sleep(FREEZE)
            proc.send_signal(signal.SIGCONT)

    def run(self, seconds: float) -> Figures:
        try:
            for identity in ("a", "b", "c"):
                self.spawn(identity)
            deadline = time.monotonic() + seconds
            time.sleep(2)
            while time.monotonic() < deadline:
                self.fault()
                time.sleep(self.rng.uniform(2, 4))
            time.sleep(2)  # the last leader runs the ticks of the last handover
        finally:
            for proc in self.procs.values():
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.terminate()
            for proc in self.procs.values():
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        figures = check(self.read())
        figures.late_failed_written = asyncio.run(self.written(figures.late_failed))
        return figures

    async def written(self, late: list[tuple[int, int]]) -> int:
        """How many of the ``late`` writes (tick, token) that failed are in the store all the same."""
        if not late:
            return 0
        import aioelect
        from aioelect.integrations.schedule import Every, Ticks

        options: dict[str, Any] = {self.backend: self.target, **self.options}
        async with aioelect.new(name=self.name, identity="checker", **options) as e:
            store = Ticks("soak", Every(PERIOD)).store(e)
            found = [await store.get(f"out/{tick}") for tick, _ in late]
        return sum(1 for value, (_, token) in zip(found, late, strict=True) if value and value["token"] == token)


def report(backend: str, figures: Figures) -> str:
    return (
        f"{backend}: {figures.runs} runs for {figures.ticks} ticks, duplicate ticks {figures.duplicates}, "
        f"lost ticks {figures.lost}, dropped by a leader killed or stopped between record and job {figures.dropped}; "
        f"late writes {figures.late_writes}, refused by the fence {figures.late_refused}, "
        f"accepted {figures.late_accepted}, failed {len(figures.late_failed)} (of which written after all: "
        f"{figures.late_failed_written}); faults {dict(sorted(figures.faults.items()))} -> "
        f"{'OK' if figures.ok else 'FAILED'}"
    )


def timeline(events: list[dict[str, Any]]) -> list[str]:
    """What a frozen leader did, line by line: who led, who froze, whose write was refused."""
    lines = []
    for event in events:
        kind, who = event["e"], event.get("who")
        if kind == "lead":
            lines.append(f"  {who}  leads, token {event['token']}")
        elif kind == "freeze":
            lines.append(f"  {who}  tick {event['tick']}: check() passed, then frozen (SIGSTOP) before its write")
        elif kind == "send":
            if event.get("late"):
                lines.append(f"  {who}  resumed: sends its write of tick {event['tick']} under token {event['token']}")
        elif kind == "write" and event["result"] != "done":
            lines.append(f"  {who}  write of tick {event['tick']} (token {event['token']}): {event['result'].upper()}")
    return lines


def start_server(backend: str, stack: contextlib.ExitStack) -> str:
    """A throwaway server of the repository's test harness; its DSN, URL or endpoint."""
    from tests import harness

    factory = {
        "redis": harness.RedisServer,
        "etcd": harness.EtcdServer,
        "mysql": harness.MariaDBServer,
        "postgres": harness.PostgresServer,
    }[backend]
    server: Any = factory()
    stack.callback(server.cleanup)
    server.start()
    return str(server.url if backend == "redis" else server.endpoint if backend == "etcd" else server.dsn)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.ticks")
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker")
    for flag in ("--backend", "--target", "--name", "--identity", "--options", "--events"):
        w.add_argument(flag, required=True)
    w.add_argument("--period", type=float, default=PERIOD)
    w.add_argument("--job", type=float, default=JOB)
    parser.add_argument("--backend", action="append", choices=sorted(OPTIONS), help="default: all of them")
    parser.add_argument("--seconds", type=float, default=60.0, help="faults for this long, per backend")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--demo", action="store_true", help="`make demo`: freeze Redis leaders, print the timeline")
    args = parser.parse_args(argv)
    if args.command == "worker":
        asyncio.run(worker(args))
        return 0
    if args.demo:
        return demo(args.seed if args.seed is not None else 1)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    ok = True
    for backend in args.backend or sorted(OPTIONS):
        with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="soak-ticks-") as tmp:
            target = str(Path(tmp) / "leader.lock") if backend == "file" else start_server(backend, stack)
            figures = Soak(backend, target, Path(tmp), seed, OPTIONS[backend]).run(args.seconds)
            print(report(backend, figures) + f" (seed {seed})", flush=True)
            for error in sorted(figures.late_errors):
                print(f"  a late write failed: {error}", flush=True)
            if not figures.ok:
                for log in sorted(Path(tmp).glob("*.log")):
                    print(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}", flush=True)
            ok = ok and figures.ok
    return 0 if ok else 1


def demo(seed: int) -> int:
    """A Redis leader frozen mid-job past its lease; its late write refused by the fence."""
    import importlib.util

    if importlib.util.find_spec("redis") is None:
        print("frozen-leader demo not run: it needs the redis driver (pip install 'aioelect[redis]', or `make venv`)")
        return 0
    from tests import harness

    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="soak-ticks-") as tmp:
        try:
            target = start_server("redis", stack)
        except harness.MissingBinaryError as exc:
            print(f"frozen-leader demo not run: {exc} (install the servers with `make servers`)")
            return 0
        print("frozen leader: three workers run a tick every 0.5 s on Redis (lease 3 s); the leader is frozen")
        print("right after its check() passed, for 6 s, then resumed with its write in flight:")
        soak = Soak("redis", target, Path(tmp), seed, OPTIONS["redis"])
        soak.kinds = ["freeze"]
        soak.run(9)
        events = soak.read()
        figures = check(events)  # marks the late sends
        for line in timeline(events):
            print(line)
        print(report("redis", figures))
        return 0 if figures.ok and figures.late_writes > 0 and figures.late_refused == figures.late_writes else 1


if __name__ == "__main__":
    sys.exit(main())
