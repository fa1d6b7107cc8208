"""``python -m bench.handovers``: the leaderless gap of a planned handover, a release and a crash; rolling deploys.

On every backend (MariaDB, PostgreSQL, etcd, Redis, file; throwaway servers on 127.0.0.1), each candidate its own
OS process (``bench/candidates/aioelect_handover.py``, the line protocol of the other scenarios):

* **planned handover**: the leader calls ``step_down(to=...)`` naming the candidate that waited *last*; from its
  ``RELEASING`` stamp (its work stops) to the next ``LEADER`` stamp, and whether that was the named one;
* **release**: the leader calls ``Leadership.release()`` (what leaving ``async with leadership()`` does); from
  ``RELEASING`` to the next ``LEADER``;
* **crash**: SIGKILL to the leader; from the signal to the next ``LEADER`` (bounded by the etcd TTL / Redis lease,
  5 s as in the main bench; MariaDB, PostgreSQL and flock let go when the connection or descriptor closes);
* **overlap**: the old leader's ``ACT`` stamps (taken while ``Leadership.held``) later than the new ``LEADER``;
* **rolling deploy**: 3 instances of priority 0 under ``aioelect.run(elector.run(work))``, replaced one at a
  time by 3 of priority 1 (``settle`` 0.5 s): start ``new-i``, wait until it campaigns (and, in the second
  variant, ``settle`` + 2 s more: the wait, the leader's 1 s poll for requests, a margin), SIGTERM ``old-i``,
  wait until it exits. Counted: moves of leadership, leaderless time in all (each move's work stopped to work
  started), overlap.

Writes bench/out/handovers.json and its section of bench/RESULTS.md (between ``<!-- handovers -->`` markers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._driver import CandidateProc, Event, Group
from ._numbers import fmt_s, median
from ._servers import Servers

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
BEGIN, END = "<!-- handovers -->", "<!-- /handovers -->"
BACKENDS = ("mysql", "postgres", "etcd", "redis", "file")
LABEL = {"mysql": "MariaDB", "postgres": "PostgreSQL", "etcd": "etcd", "redis": "Redis", "file": "file (flock)"}
MODULE = "aioelect_handover"
START_TIMEOUT = 30.0
SETTLE = 0.4  # between repetitions: the old leader back in line


class Setup(Exception):
    """The candidates could not be brought to the starting line."""


def _other_leader(proc: CandidateProc, after: int = 0) -> Callable[[Event], bool]:
    return lambda e: e.kind == "LEADER" and e.proc is not proc and e.ns > after


def _from(proc: CandidateProc, *kinds: str) -> Callable[[Event], bool]:
    return lambda e: e.proc is proc and e.kind in kinds


def _overlap(group: Group, old: CandidateProc, new: Event, mark: int) -> float:
    """Seconds the old leader still acted after ``new`` led (its latest ``ACT`` stamp after the new ``LEADER``)."""
    acts = [e.ns for e in group.bus.events[mark:] if e.proc is old and e.kind == "ACT"]
    return max(0.0, (max(acts, default=0) - new.ns) / 1e9)


class Election:
    """Candidate processes of one backend in one election, each with an identity."""

    def __init__(self, backend: str, servers: Servers, log_dir: Path, label: str) -> None:
        name = f"/bench-handovers/{label}-{secrets.token_hex(3)}"
        args = ["--backend", backend, "--url", servers.url(backend), "--ttl", "5"]
        self.group = Group(MODULE, name, args, log_dir / backend, label)
        self.identity: dict[int, str] = {}  # id(proc) -> identity

    async def spawn(self, identity: str, *extra: str) -> CandidateProc:
        proc = await self.group.spawn(extra=["--identity", identity, *extra])
        self.identity[id(proc)] = identity
        if not await self.group.wait_campaigning(proc, 1, START_TIMEOUT):
            raise Setup(f"{identity} did not start campaigning: see {proc.log_path}")
        return proc

    async def leader(self) -> Event:
        lead = await self.group.wait_leader(START_TIMEOUT)
        if lead is None:
            raise Setup(f"no leader within {START_TIMEOUT:g} s")
        return lead

    def live(self) -> list[CandidateProc]:
        return [p for p in self.group.procs if not p.exited.is_set()]


async def gaps(backend: str, servers: Servers, log_dir: Path, reps: int) -> dict[str, Any]:
    """Planned handover, release and crash, ``reps`` times each, in one election of 3 candidate processes."""
    out: dict[str, Any] = {k: {"gaps": [], "overlaps": [], "errors": []} for k in ("planned", "release", "crash")}
    out["planned"]["named"] = 0
    election = Election(backend, servers, log_dir, "gaps")
    group = election.group
    try:
        for i in range(3):
            await election.spawn(f"c{i}")
        await election.leader()
        await asyncio.sleep(SETTLE)
        for kind in ("planned", "release"):
            for _ in range(reps):
                lead = await election.leader()
                old = lead.proc
                # The candidate that waited last: first in line would lead anyway on most backends.
                waiting = [p for p in election.live() if p is not old]
                target = max(waiting, key=lambda p: max(e.ns for e in group.bus.events if _from(p, "CAMPAIGN")(e)))
                mark = group.bus.mark()
                old.send(f"stepdown {election.identity[id(target)]}" if kind == "planned" else "release")
                rel = await group.bus.wait_for(_from(old, "RELEASING"), 10.0, mark)
                new = await group.bus.wait_for(_other_leader(old), 15.0, mark)
                if rel is None or new is None:
                    out[kind]["errors"].append("no RELEASING" if rel is None else "nobody led within 15 s")
                    break
                out[kind]["gaps"].append((new.ns - rel.ns) / 1e9)
                if kind == "planned":
                    out[kind]["named"] += new.proc is target
                await group.bus.wait_for(_from(old, "RELEASED", "ERROR"), 15.0, mark)
                await asyncio.sleep(0.2)  # the old leader's last stamps are in
                out[kind]["overlaps"].append(_overlap(group, old, new, mark))
                old.send("campaign")
                await group.bus.wait_for(_from(old, "CAMPAIGN"), 10.0, mark)
                await asyncio.sleep(SETTLE)
        for rep in range(reps):
            lead = await election.leader()
            old = lead.proc
            mark = group.bus.mark()
            t0 = old.signal(signal.SIGKILL)
            new = await group.bus.wait_for(_other_leader(old, t0), 20.0, mark)
            await old.close()
            if new is None:
                out["crash"]["errors"].append("nobody led within 20 s")
                break
            out["crash"]["gaps"].append((new.ns - t0) / 1e9)
            out["crash"]["overlaps"].append(_overlap(group, old, new, mark))
            await election.spawn(f"r{rep}")
            await asyncio.sleep(SETTLE)
    finally:
        await group.close()
    return out


async def rolling(backend: str, servers: Servers, log_dir: Path, settle: float, pause: float) -> dict[str, Any]:
    """3 old instances (priority 0) replaced one at a time by 3 new ones (priority 1); moves, leaderless, overlap."""
    election = Election(backend, servers, log_dir, f"rolling-{pause:g}")
    group = election.group
    deployed = ("--priority", "{}", "--settle", str(settle))
    olds: list[CandidateProc] = []
    result: dict[str, Any] = {"pause": pause, "settle": settle, "errors": []}
    try:
        for i in range(3):
            olds.append(await election.spawn(f"old-{i}", *(a.format(0) for a in deployed)))
            if i == 0:
                await election.leader()
        await asyncio.sleep(2 * settle)  # equal priorities: nobody asks
        mark = group.bus.mark()
        first = await election.leader()
        for i in range(3):
            await election.spawn(f"new-{i}", *(a.format(1) for a in deployed))
            await asyncio.sleep(pause)
            olds[i].signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(olds[i].exited.wait(), 20.0)
            except TimeoutError:
                result["errors"].append(f"old-{i} did not exit within 20 s of SIGTERM")
        await asyncio.sleep(2 * settle + 2)  # any request still to come
        result.update(_moves(election, first, mark))
    finally:
        await group.close()
    return result


def _moves(election: Election, first: Event, mark: int) -> dict[str, Any]:
    """Moves of leadership after ``mark``, the leaderless time between each leader's end and the next's start."""
    events = sorted(election.group.bus.events[mark:], key=lambda e: e.ns)
    leaders = [e for e in events if e.kind == "LEADER"]
    moves, leaderless, overlap = [], 0.0, 0.0
    previous = first
    for new in leaders:
        ended = [e.ns for e in events if e.proc is previous.proc and e.kind in ("RELEASING", "STOPPED", "EXITED")]
        end = min((ns for ns in ended if ns > previous.ns), default=None)
        acts = [e.ns for e in events if e.proc is previous.proc and e.kind == "ACT"]
        overlap = max(overlap, (max(acts, default=0) - new.ns) / 1e9)
        if end is not None:
            leaderless += max(0.0, (new.ns - end) / 1e9)
        moves.append(f"{election.identity[id(previous.proc)]}→{election.identity[id(new.proc)]}")
        previous = new
    t0 = first.ns
    trace = [
        f"{(e.ns - t0) / 1e9:.3f} {election.identity.get(id(e.proc), '?')} {e.kind}"
        for e in events
        if e.kind in ("CAMPAIGN", "LEADER", "RELEASING", "RELEASED", "STOPPED", "EXIT", "EXITED")
    ]
    return {
        "trace": trace,
        "moves": moves,
        "leaderless": leaderless,
        "overlap": max(0.0, overlap),
        "final": election.identity[id(previous.proc)],
    }


async def run_all(args: argparse.Namespace, servers: Servers) -> dict[str, Any]:
    log_dir = OUT / "logs" / "handovers"
    log_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for backend in args.backends:
        entry: dict[str, Any] = {}
        for what, coro in (
            ("gaps", lambda b=backend: gaps(b, servers, log_dir, args.reps)),
            ("rolling-ready", lambda b=backend: rolling(b, servers, log_dir, args.settle, 0.0)),
            ("rolling-settled", lambda b=backend: rolling(b, servers, log_dir, args.settle, args.settle + 2.0)),
        ):
            t = time.monotonic()
            try:
                entry[what] = await asyncio.wait_for(coro(), 300.0)
            except (Setup, TimeoutError) as exc:
                entry[what] = {"errors": [f"{type(exc).__name__}: {exc}"]}
            print(f"bench.handovers: {backend} {what} ({time.monotonic() - t:.0f} s): {entry[what]}", flush=True)
        results[backend] = entry
    return results


# --- report ---------------------------------------------------------------------------------


def _cell(part: dict[str, Any] | None, reps: int) -> str:
    if not part or not part.get("gaps"):
        return "; ".join(part.get("errors", [])) if part else "-"
    xs = part["gaps"]
    cell = f"{fmt_s(median(xs))} / {fmt_s(max(xs))}"
    if len(xs) < reps:
        cell += f" ({len(xs)} of {reps})"
    return cell


def _overlap_cell(parts: list[dict[str, Any] | None]) -> str:
    values = [v for p in parts if p for v in p.get("overlaps", [])]
    return "-" if not values else ("0" if max(values) == 0 else f"**{fmt_s(max(values))}**")


def _rolling_cell(part: dict[str, Any] | None) -> str:
    if not part or "moves" not in part:
        return "; ".join(part.get("errors", [])) if part else "-"
    moves = part["moves"]
    overlap = "0" if part["overlap"] == 0 else f"**{fmt_s(part['overlap'])}**"
    errors = f"; {'; '.join(part['errors'])}" if part.get("errors") else ""
    return (
        f"{len(moves)} ({', '.join(moves) or 'none'}); {fmt_s(part['leaderless'])} leaderless; overlap {overlap}"
        f"{errors}"
    )


def table(results: dict[str, Any], reps: int, settle: float) -> list[str]:
    lines = [
        f"| Backend | planned `step_down(to=...)` | named successor led | release | crash (SIGKILL) | overlap (max) "
        f"| rolling, old stopped once new campaigns: moves; leaderless; overlap "
        f"| rolling, old stopped {settle + 2:g} s after new campaigns |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend, entry in results.items():
        g = entry.get("gaps", {})
        planned = g.get("planned")
        named = f"{planned['named']} of {len(planned['gaps'])}" if planned and planned.get("gaps") else "-"
        lines.append(
            f"| **aioelect {LABEL[backend]}** | {_cell(planned, reps)} | {named} | {_cell(g.get('release'), reps)} "
            f"| {_cell(g.get('crash'), reps)} "
            f"| {_overlap_cell([g.get('planned'), g.get('release'), g.get('crash')])} "
            f"| {_rolling_cell(entry.get('rolling-ready'))} | {_rolling_cell(entry.get('rolling-settled'))} |"
        )
    lines.append(
        "| client-go `leaderelection`, `ReleaseOnCancel: true` (Kubernetes Lease; documented, **not measured** by us) "
        '| no named successor | - | ~0 to 2 s claimed: waiters retry every `RetryPeriod` ("core clients default this '
        'value to 2 seconds") | up to `LeaseDuration` (15 s in core clients) + `RetryPeriod` '
        '| not fenced: "you may have two processes simultaneously acting" if work outlives the cancel '
        "| - | - |"
    )
    return lines


def write(results: dict[str, Any], args: argparse.Namespace, meta: dict[str, Any]) -> list[str]:
    """Write bench/out/handovers.json and the section of RESULTS.md; return the section."""
    settle = args.settle
    OUT.mkdir(exist_ok=True)
    (OUT / "handovers.json").write_text(
        json.dumps({"meta": meta, "args": vars(args), "results": results}, indent=1, ensure_ascii=False)
    )
    section = [
        BEGIN,
        "## Planned handovers, releases, crashes and rolling deploys",
        "",
        f"Generated by `python -m bench.handovers` (`make bench-handovers`; {meta['date']}; {meta['cores']} cores "
        f"shared with other work, load average {meta['load']:.1f}; Python {meta['python']}; {meta['servers']}). "
        f"Cells are **median / max** over {args.reps} repetitions in one run, each candidate its own OS process "
        "(3 per election; the method is that of the table above: stamps of `time.monotonic_ns()`). *Planned*: "
        "the leader calls `step_down(to=...)` naming the candidate that waited last, from its work stopping to the "
        "next leader's start; *release*: `Leadership.release()` (what leaving `async with leadership()` does); "
        "*crash*: SIGKILL, from the signal to the next leader (etcd TTL and Redis lease 5 s; MariaDB, PostgreSQL and "
        "flock let go when the dead process's connection or descriptor closes). *Overlap*: how long an old leader "
        "still acted (`Leadership.held`) after the next one started, over all three (goal 0). *Rolling*: 3 "
        f"instances of priority 0 (`aioelect.run(elector.run(work))`, `set_priority(0, settle={settle:g})`) "
        "replaced one at a time by 3 of priority 1: start new-i, stop old-i with SIGTERM (a release) once new-i "
        "campaigns (or a pause later), wait until it exits; moves of leadership (goal 1), the leaderless time of "
        "all moves together (each from the old leader's work stopping to the new one's starting), overlap (goal 0).",
        "",
        *table(results, args.reps, args.settle),
        "",
        "In the first rolling variant each old instance is stopped as soon as its replacement is campaigning (its "
        "`campaigning` event, sent once it has said that it waits with its priority), long before `settle`: the "
        "stopping leader hands over to the waiting candidate of a higher priority instead of a plain release, so "
        "leadership moves once, to the first new instance. In the second, the new instance's own request "
        "(after `settle`) is served before the old leader stops: one move as well. The client-go row quotes its "
        "`LeaderElectionConfig` documentation: its gap after a release is the waiters' retry period, not a "
        "notification, and it has no named successor.",
        END,
    ]
    path = HERE / "RESULTS.md"
    text = path.read_text() if path.exists() else ""
    if BEGIN in text:
        text = text[: text.index(BEGIN)].rstrip("\n") + "\n\n" + "\n".join(section) + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(section) + "\n"
    path.write_text(text)
    return section


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.handovers", description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--settle", type=float, default=0.5, help="the rolling deploy's set_priority settle time")
    parser.add_argument("--backend", default=",".join(BACKENDS), help=f"comma-separated, of {', '.join(BACKENDS)}")
    parser.add_argument("--report-only", action="store_true", help="render bench/out/handovers.json again")
    args = parser.parse_args()
    if args.report_only:
        saved = json.loads((OUT / "handovers.json").read_text())
        print("\n".join(write(saved["results"], argparse.Namespace(**saved["args"]), saved["meta"])))
        return 0
    args.backends = [b for b in args.backend.split(",") if b]
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends: {sorted(unknown)}")
    servers = Servers()
    signal.signal(signal.SIGTERM, _interrupt)  # a stopped run still stops its servers
    try:
        servers.start(set(args.backends))
        results = asyncio.run(run_all(args, servers))
        versions = servers.versions()
        meta = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cores": os.cpu_count(),
            "load": os.getloadavg()[0],
            "python": platform.python_version(),
            "servers": ", ".join(f"{k} {v.split()[0].split('-')[0]}" for k, v in versions.items()),
        }
        print("\n".join(write(results, args, meta)))
    finally:
        servers.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
