"""One benchmark run: servers up, scenarios in three phases, results out, everything cleaned up."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._impls import IMPLS, Impl
from ._oneshot import coldstart, inproc, rtt
from ._report import write_report
from ._scale import scale
from ._scenarios import SCENARIOS as TIMED
from ._scenarios import Ctx, Outcome
from ._servers import Servers

__all__ = ["run"]

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
RESULTS_JSON = OUT / "results.json"

SCENARIOS: dict[str, Callable[[Impl, Ctx], Awaitable[Outcome]]] = {
    "rtt": rtt,
    **TIMED,
    "coldstart": coldstart,
    "inproc": inproc,
    "scale": scale,
}
#: Scenarios whose timing must not be disturbed: run one at a time, with nothing else running.
PRECISE = ("rtt", "graceful", "crash", "handoff", "coldstart", "inproc")
#: Only aioelect's rows: the round trip is the backend's (measured once); scale and a blocked loop ask about aioelect.
OURS_ONLY = ("rtt", "scale", "blocked")
#: ``--quick``: aioelect and the fastest peer of each backend at graceful handover.
QUICK_IMPLS = ("tooz-mysql", "baseline-etcd", "tooz-postgres", "python-redis-lock", "tooz-file")
QUICK_SCENARIOS = ("rtt", "graceful", "handoff", "inproc", "scale")
SCALE_ORDER = ("aioelect-file", "aioelect-mysql", "aioelect-etcd-shared", "aioelect-etcd", "aioelect-postgres")
_NOT_SETTINGS = ("servers", "log_dir", "scale_servers")


def _machine() -> dict[str, Any]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import psutil

    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        # Candidates raise their soft limit to this hard limit (a descriptor per connection or lock file).
        "nofile_hard": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        "scale_max_connections": {
            "MariaDB": Servers.MARIADB_MAX_CONNECTIONS[1],
            "PostgreSQL": Servers.POSTGRES_MAX_CONNECTIONS[1],
        },
    }


def _library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in (
        "aioelect",
        "aiomysql",
        "aetcd",
        "asyncpg",
        "redis",
        "tooz",
        "etcd3gw",
        "PyMySQL",
        "psycopg2-binary",
        "python-redis-lock",
        "pottery",
    ):
        with contextlib.suppress(PackageNotFoundError):
            out[name] = version(name)
    return out


class Runner:
    def __init__(self, ctx: Ctx, budget: float) -> None:
        self.ctx = ctx
        self.started = time.monotonic()
        self.budget = budget
        self.results: dict[str, dict[str, Outcome]] = {}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.started)

    async def job(self, impl: Impl, scenario: str, limit: float) -> None:
        """Run one scenario for one implementation, bounded in time; failures become notes, not crashes."""
        slot = self.results.setdefault(impl.key, {})
        if self.left() < 5:
            slot[scenario] = Outcome(skipped="skipped: the run's time budget was spent")
            print(f"  {impl.key:18} {scenario:9} skipped (budget)", flush=True)
            return
        t = time.monotonic()
        func = SCENARIOS[scenario]
        try:
            outcome = await asyncio.wait_for(func(impl, self.ctx), timeout=min(limit, max(self.left(), 10)))
        except TimeoutError:
            outcome = Outcome(errors=[f"scenario did not finish within {limit:g}s"])
        except Exception as exc:
            outcome = Outcome(errors=[f"{type(exc).__name__}: {exc}"[:400]])
        outcome.seconds = time.monotonic() - t
        slot[scenario] = outcome
        summary = ", ".join(f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s" for v in outcome.values[:8])
        extra = f" never={outcome.never}" if outcome.never else ""
        errs = f" errors={outcome.errors[:1]}" if outcome.errors else ""
        print(f"  {impl.key:18} {scenario:9} {outcome.seconds:5.1f}s [{summary}]{extra}{errs}", flush=True)


def _limit(impl: Impl, scenario: str, ctx: Ctx) -> float:
    if scenario == "scale":
        return len(ctx.scale_counts) * (ctx.scale_start_timeout + 90)
    if scenario in ("rtt", "coldstart", "inproc"):
        return 60.0 + 25 * (ctx.coldstart_reps + 1)
    if scenario == "idle":
        return 60.0 + sum(ctx.idle_windows) * 1.5 + 120
    if scenario == "handoff":
        return ctx.handoff_seconds + 60
    if scenario in ("crash", "frozen"):
        per = impl.takeover_window + ctx.overlap_window + ctx.start_timeout
        return per * (1 if impl.lease_bound_crash or scenario == "frozen" else ctx.reps) + 30
    if scenario == "deposed":
        return impl.deposed_window + ctx.start_timeout + 30
    if scenario == "blocked":  # one pair per step, each a start, 1.5 s, the block and 2 s
        steps = round(ctx.block_max / ctx.block_step)
        return steps * (ctx.start_timeout / 3 + 6) + ctx.block_max * steps / 2 + 60
    return ctx.reps * (ctx.graceful_window + 10) + ctx.start_timeout


def _runs(impl: Impl, scenario: str, scenarios: list[str]) -> bool:
    if scenario not in scenarios or (impl.scenarios is not None and scenario not in impl.scenarios):
        return False
    if scenario == "inproc":  # aioelect and the fastest peer of each backend (tooz MySQL's is its 1 s poll)
        return impl.ours or (impl.key in QUICK_IMPLS and impl.key != "tooz-mysql")
    return impl.ours or scenario not in OURS_ONLY


async def _phases(runner: Runner, impls: list[Impl], scenarios: list[str], overlap_phases: bool) -> None:
    ctx = runner.ctx
    print("phase 1: latency-sensitive scenarios, one at a time", flush=True)
    for impl in impls:
        for scenario in PRECISE:
            if not _runs(impl, scenario, scenarios):
                continue
            if scenario == "crash" and impl.lease_bound_crash:
                continue
            await runner.job(impl, scenario, _limit(impl, scenario, ctx))

    async def scale_lane() -> None:
        print("scale: N elections per process, its own servers, beside phase 2", flush=True)
        # The heaviest (thousands of PostgreSQL sessions, a thousand etcd leases per process) last, when
        # phase 2 has ended or nearly.
        for impl in sorted(impls, key=lambda i: SCALE_ORDER.index(i.key) if i.key in SCALE_ORDER else 0):
            if _runs(impl, "scale", scenarios):
                await runner.job(impl, "scale", _limit(impl, "scale", ctx))

    async def phase2() -> None:
        print("phase 2: lease-bound scenarios (seconds), several implementations side by side", flush=True)
        sem = asyncio.Semaphore(5)

        async def bounded(impl: Impl, scenario: str) -> None:
            async with sem:
                await runner.job(impl, scenario, _limit(impl, scenario, ctx))

        jobs = []
        # The longest (etcdctl's 60 s TTL) first, so that they overlap everything else.
        for impl in sorted(impls, key=lambda i: -i.takeover_window):
            for scenario in ("crash", "frozen", "deposed"):
                if _runs(impl, scenario, scenarios) and (scenario != "crash" or impl.lease_bound_crash):
                    jobs.append(bounded(impl, scenario))
        await asyncio.gather(*jobs)

    async def phase3() -> None:
        if "idle" not in scenarios:
            return
        print("phase 3: idle cost, one implementation per server at a time", flush=True)

        async def lane(backend: str) -> None:
            for impl in impls:
                if impl.backend == backend and _runs(impl, "idle", scenarios):
                    await runner.job(impl, "idle", _limit(impl, "idle", ctx))

        await asyncio.gather(*(lane(b) for b in sorted({i.backend for i in impls})))

    async def phase4() -> None:
        # How long a block the leader survives depends on how soon its loop runs again after it: nothing beside.
        print("phase 4: a blocked event loop, one implementation at a time", flush=True)
        for impl in impls:
            if _runs(impl, "blocked", scenarios):
                await runner.job(impl, "blocked", _limit(impl, "blocked", ctx))

    if overlap_phases:
        # Smoke runs only: everything side by side; the counters of phase 3 then include phase 2's traffic.
        await asyncio.gather(scale_lane(), phase2(), phase3(), phase4())
        return
    # Scale has servers of its own, so its counters stay apart; its CPU load makes phase 2 noisier, which
    # that phase's second-scale bounds tolerate. Phase 3 measures CPU, and phase 4 a blocked loop: each alone.
    await asyncio.gather(scale_lane(), phase2())
    await phase3()
    await phase4()


def _outcome_to_json(outcome: Outcome) -> dict[str, Any]:
    data = dataclasses.asdict(outcome)
    return data


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the suite as the command line says; return the exit status."""
    backends = sorted({b for b in args.backend.split(",") if b})
    # A run of some backends only must not replace the report of the whole suite: it writes beside it.
    where = OUT / "-".join(backends) if backends else HERE
    results_json = where / "results.json" if backends else RESULTS_JSON
    if args.report_only:
        data = json.loads(results_json.read_text())
        write_report(data, where)
        print(f"wrote {where / 'RESULTS.md'} and {where / 'takeover.png'}")
        return 0
    only = {k for k in args.only.split(",") if k}
    if args.quick and not only:
        only = {i.key for i in IMPLS if i.ours} | set(QUICK_IMPLS)
    default = QUICK_SCENARIOS if args.quick else SCENARIOS
    scenarios = [s for s in (args.scenarios.split(",") if args.scenarios else default) if s]
    unknown = [s for s in scenarios if s not in SCENARIOS] + [k for k in only if k not in {i.key for i in IMPLS}]
    if unknown:
        print(f"unknown scenario or implementation: {', '.join(unknown)}", file=sys.stderr)
        return 2
    unknown_backends = [b for b in backends if b not in {i.backend for i in IMPLS}]
    if unknown_backends:
        print(f"unknown backend: {', '.join(unknown_backends)}", file=sys.stderr)
        return 2
    chosen = [i for i in IMPLS if (not only or i.key in only) and (not backends or i.backend in backends)]
    unavailable = {i.key: why for i in chosen if (why := i.missing()) is not None}
    impls = [i for i in chosen if i.key not in unavailable]
    for key, why in unavailable.items():
        print(f"bench: {key} not measured: {why}", flush=True)

    log_dir = OUT / "logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    machine = _machine()
    started_at = datetime.now(timezone.utc)
    t0 = time.monotonic()
    servers = Servers()
    scale_servers = Servers(scale=True)
    # A SIGTERM (make interrupted, CI timeout) must still stop the servers.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(f"bench: starting servers for {', '.join(sorted({i.backend for i in impls}))}", flush=True)
        servers.start({i.backend for i in impls})
        ctx = Ctx(servers=servers, log_dir=log_dir)
        if "scale" in scenarios:
            scale_servers.start({i.backend for i in impls if _runs(i, "scale", scenarios)})
            ctx.scale_servers = scale_servers
        if args.quick:
            ctx.reps = 3
            ctx.idle_counts = (5, 20)
            ctx.idle_windows = (2.0, 3.0, 5.0)
            ctx.handoff_seconds = 2.0
            ctx.overlap_window = 2.0
            ctx.settle = 0.3
            ctx.rtt_count = 100
            ctx.coldstart_reps = 5
            ctx.scale_counts = (1, 10)
            ctx.scale_window = 2.0
            ctx.scale_settle = 0.5
        if args.reps:
            ctx.reps = args.reps
        if args.scale:
            ctx.scale_counts = tuple(int(n) for n in args.scale.split(","))
        runner = Runner(ctx, args.budget)
        asyncio.run(_phases(runner, impls, scenarios, overlap_phases=bool(args.quick)))
        versions = servers.versions()
    finally:
        servers.cleanup()
        scale_servers.cleanup()
    machine["load_after"] = [round(x, 2) for x in os.getloadavg()]
    data = {
        "command": "python -m bench" + (" " + shlex.join(argv) if argv else ""),
        "started": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t0, 1),
        "budget_s": args.budget,
        "machine": machine,
        "servers": versions,
        "libraries": _library_versions(),
        "settings": {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx) if f.name not in _NOT_SETTINGS},
        "quick": bool(args.quick),
        "impls": {
            i.key: {
                "label": i.label,
                "backend": i.backend,
                "ours": i.ours,
                "how": i.how,
                "takeover_window": i.takeover_window,
                "deposed_window": i.deposed_window,
            }
            for i in chosen
        },
        "unavailable": unavailable,
        "scenarios": scenarios,
        "results": {k: {s: _outcome_to_json(o) for s, o in v.items()} for k, v in runner.results.items()},
    }
    where.mkdir(parents=True, exist_ok=True)
    results_json.parent.mkdir(parents=True, exist_ok=True)
    results_json.write_text(json.dumps(data, indent=1, default=str))
    write_report(data, where)
    print(f"bench: done in {data['duration_s']}s; wrote {where / 'RESULTS.md'} and {where / 'takeover.png'}")
    return 0
