"""The seven scenarios, each measured the same way for every implementation from the candidates' lines."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._driver import Event, Group, now_ns
from ._impls import Impl
from ._servers import Servers, process_usage

__all__ = ["SCENARIOS", "Ctx", "Outcome", "SetupError"]


class SetupError(Exception):
    """A group of candidates could not be brought to the starting line."""


@dataclass
class Ctx:
    """Settings of one run, shared by every scenario."""

    servers: Servers
    log_dir: Path
    reps: int = 5
    candidates: int = 3
    settle: float = 0.4
    start_timeout: float = 30.0
    graceful_window: float = 10.0
    overlap_window: float = 3.0
    idle_counts: tuple[int, int] = (20, 100)
    idle_windows: tuple[float, float, float] = (3.0, 10.0, 20.0)
    handoff_seconds: float = 5.0
    frozen_lease: int = 5
    #: The blocked-loop scenario: block lengths are stepped by this much, up to block_max (seconds).
    block_step: float = 0.5
    block_max: float = 6.0
    rtt_count: int = 200
    coldstart_reps: int = 10
    scale_counts: tuple[int, ...] = (1, 10, 100, 1000)
    scale_window: float = 6.0
    scale_settle: float = 2.0
    scale_batch: int = 25
    scale_samples: int = 3
    scale_start_timeout: float = 150.0
    #: Servers of the scale scenario (their own, so that its load and counters stay apart from the rest).
    scale_servers: Servers | None = None


@dataclass
class Outcome:
    """What one scenario measured for one implementation."""

    values: list[float] = field(default_factory=list)  # seconds, one per repetition that saw the event
    never: int = 0  # repetitions in which the event did not come within ``window``
    window: float = 0.0
    overlap: list[float] = field(default_factory=list)  # frozen: seconds still acting after waking
    overlap_never: int = 0  # frozen: still acting when the observation ended
    acts_after_wake: list[int] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    note: str = ""
    skipped: str = ""
    seconds: float = 0.0  # wall time the scenario took

    def merge(self, other: Outcome) -> None:
        self.values += other.values
        self.never += other.never
        self.overlap += other.overlap
        self.overlap_never += other.overlap_never
        self.acts_after_wake += other.acts_after_wake
        self.errors += other.errors
        self.window = max(self.window, other.window)


def _args(impl: Impl, ctx: Ctx) -> list[str]:
    return ["--url", ctx.servers.url(impl.backend), "--ttl", "5", *impl.extra_args]


def _log_tail(path: Path, lines: int = 4) -> str:
    with contextlib.suppress(OSError):
        text = path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])
    return ""


async def _start_group(
    impl: Impl, ctx: Ctx, scenario: str, rep: int | str, count: int, extra: tuple[str, ...] = ()
) -> Group:
    """``count`` one-slot candidates in a fresh election, a leader among them, the others campaigning."""
    name = impl.election(scenario, rep)
    group = Group(impl.module, name, _args(impl, ctx), ctx.log_dir / impl.key, f"{scenario}-{rep}")
    try:
        procs = [await group.spawn(extra=extra) for _ in range(count)]
        for proc in procs:
            if not await group.wait_campaigning(proc, 1, ctx.start_timeout):
                raise SetupError(f"{proc.label} did not start campaigning: {_log_tail(proc.log_path)}")
        if await group.wait_leader(ctx.start_timeout) is None:
            raise SetupError(f"no leader within {ctx.start_timeout:g}s: {_log_tail(procs[0].log_path)}")
        await asyncio.sleep(ctx.settle)
    except BaseException:
        await group.close()
        raise
    return group


def _same(e: Event, lead: Event) -> bool:
    return e.proc is lead.proc and e.slot == lead.slot


def _stopped(lead: Event) -> Callable[[Event], bool]:
    """Matches the line saying ``lead``'s slot stopped acting as leader, or its process exiting."""
    return lambda e: (
        (_same(e, lead) and e.kind in ("STOPPED", "RELEASING")) or (e.proc is lead.proc and e.kind == "EXITED")
    )


def _from(lead: Event, *kinds: str) -> Callable[[Event], bool]:
    """Matches lines of ``kinds`` printed by the slot of ``lead``."""
    return lambda e: _same(e, lead) and e.kind in kinds


def _other_leader(lead: Event) -> Callable[[Event], bool]:
    """Matches a LEADER line of any slot but ``lead``'s."""
    return lambda e: e.kind == "LEADER" and not _same(e, lead)


# --- 1. graceful handover ---------------------------------------------------------------


async def graceful(impl: Impl, ctx: Ctx) -> Outcome:
    """The leader releases; time from its RELEASING to another candidate's LEADER."""
    out = Outcome(window=ctx.graceful_window)
    group = await _start_group(impl, ctx, "graceful", 0, ctx.candidates)
    try:
        for _ in range(ctx.reps):
            lead = await group.wait_leader(ctx.start_timeout)
            if lead is None:
                out.errors.append("no leader to release")
                break
            mark = group.bus.mark()
            lead.proc.send(f"release {lead.slot}")
            rel = await group.bus.wait_for(_from(lead, "RELEASING"), 5.0, mark)
            if rel is None:
                out.errors.append("leader did not start releasing")
                break
            new = await group.bus.wait_for(_other_leader(lead), ctx.graceful_window, mark)
            if new is None:
                out.never += 1
                break
            out.values.append((new.ns - rel.ns) / 1e9)
            # The old leader rejoins as a follower before the next repetition.
            await group.bus.wait_for(_from(lead, "RELEASED", "ERROR"), 10.0, mark)
            lead.proc.send(f"campaign {lead.slot}")
            await group.bus.wait_for(_from(lead, "CAMPAIGN"), 10.0, mark)
            await asyncio.sleep(ctx.settle)
    finally:
        await group.close()
    return out


# --- 2. crash ---------------------------------------------------------------------------------


async def _crash_once(impl: Impl, ctx: Ctx, group: Group, window: float) -> Event | None:
    lead = await group.wait_leader(ctx.start_timeout)
    if lead is None:
        raise SetupError("no leader to crash")
    mark = group.bus.mark()
    t0 = lead.proc.signal(signal.SIGKILL, lead.slot)
    new = await group.bus.wait_for(lambda e: e.kind == "LEADER" and e.proc is not lead.proc and e.ns > t0, window, mark)
    await lead.proc.close()  # the dead candidate's wrapper (etcdctl) goes too
    if new is None:
        return None
    return Event(new.kind, new.slot, new.ns - t0, "", new.proc)


async def crash(impl: Impl, ctx: Ctx) -> Outcome:
    """The leader is SIGKILLed; time from the signal to another candidate's LEADER."""
    out = Outcome(window=impl.takeover_window)
    if impl.lease_bound_crash:
        # Takeover waits for a TTL: run the repetitions side by side, each in its own election.
        async def one(rep: int) -> Outcome:
            part = Outcome(window=impl.takeover_window)
            group = await _start_group(impl, ctx, "crash", rep, 2)
            try:
                got = await _crash_once(impl, ctx, group, impl.takeover_window)
                if got is None:
                    part.never += 1
                else:
                    part.values.append(got.ns / 1e9)
            finally:
                await group.close()
            return part

        for part in await _gather(one(rep) for rep in range(ctx.reps)):
            out.merge(part)
        out.note = "repetitions run side by side (TTL-bound)"
        return out
    group = await _start_group(impl, ctx, "crash", 0, ctx.candidates)
    try:
        for _ in range(ctx.reps):
            got = await _crash_once(impl, ctx, group, impl.takeover_window)
            if got is None:
                out.never += 1
                break
            out.values.append(got.ns / 1e9)
            proc = await group.spawn()
            if not await group.wait_campaigning(proc, 1, ctx.start_timeout):
                raise SetupError(f"replacement candidate did not start: {_log_tail(proc.log_path)}")
            await asyncio.sleep(ctx.settle)
    finally:
        await group.close()
    return out


async def _gather(coros: Any) -> list[Outcome]:
    parts: list[Outcome] = []
    for result in await asyncio.gather(*coros, return_exceptions=True):
        if isinstance(result, BaseException):
            parts.append(Outcome(errors=[f"{type(result).__name__}: {result}"]))
        else:
            parts.append(result)
    return parts


# --- 3. frozen leader ----------------------------------------------------------------------------


async def frozen(impl: Impl, ctx: Ctx) -> Outcome:
    """SIGSTOP the leader: time until another leads; then SIGCONT it and watch how long it still acts."""

    async def one(rep: int) -> Outcome:
        part = Outcome(window=impl.takeover_window)
        group = await _start_group(impl, ctx, "frozen", rep, 2, impl.frozen_args)
        try:
            lead = await group.wait_leader(ctx.start_timeout)
            if lead is None:
                raise SetupError("no leader to freeze")
            mark = group.bus.mark()
            t0 = lead.proc.signal(signal.SIGSTOP, lead.slot)
            new = await group.bus.wait_for(
                lambda e: e.kind == "LEADER" and e.proc is not lead.proc and e.ns > t0, impl.takeover_window, mark
            )
            woke = lead.proc.signal(signal.SIGCONT, lead.slot)
            if new is None:
                part.never += 1
                return part
            part.values.append((new.ns - t0) / 1e9)
            ended = await group.bus.wait_for(_stopped(lead), ctx.overlap_window, mark)
            acts = [e.ns for e in group.bus.events[mark:] if _same(e, lead) and e.kind == "ACT" and e.ns >= woke]
            part.acts_after_wake.append(len(acts))
            if ended is None:
                part.overlap_never += 1
            else:
                part.overlap.append(max((t - woke for t in acts), default=0) / 1e9)
        finally:
            await group.close()
        return part

    out = Outcome(window=impl.takeover_window)
    for part in await _gather(one(rep) for rep in range(ctx.reps)):
        out.merge(part)
    if impl.frozen_args:
        out.note = "candidates run with " + " ".join(impl.frozen_args)
    return out


# --- 4. deposed leader --------------------------------------------------------------------------------


def _depose(impl: Impl, servers: Servers, group: Group, lead: Event) -> int:
    """Take leadership away on the server; return the driver's clock just before. Blocking."""
    if impl.backend == "mysql":
        t = now_ns()
        if servers.kill_lock_holder(group.name) is None:
            raise SetupError("nobody holds the lock to KILL")
        return t
    if impl.backend == "etcd":
        t = now_ns()
        if servers.revoke_leader_lease(impl.etcd_prefix(group.name)) is None:
            raise SetupError("no leased key to revoke")
        return t
    if impl.backend == "postgres":
        t = now_ns()
        if servers.terminate_lock_holder_pg(lead.proc.target_pid(lead.slot)) is None:
            raise SetupError("no advisory lock holder to terminate")
        return t
    if impl.backend == "redis":
        t = now_ns()
        if not servers.delete_redis_key(impl.redis_key(group.name)):
            raise SetupError("no lock key to delete")
        return t
    raise SetupError(f"cannot depose on {impl.backend}")


async def deposed(impl: Impl, ctx: Ctx) -> Outcome:
    """KILL the leader's connection / revoke its lease: time until it stops acting as leader."""
    if impl.no_deposed:
        return Outcome(skipped=impl.no_deposed)

    async def one(rep: int) -> Outcome:
        part = Outcome(window=impl.deposed_window)
        group = await _start_group(impl, ctx, "deposed", rep, 2)
        try:
            lead = await group.wait_leader(ctx.start_timeout)
            if lead is None:
                raise SetupError("no leader to depose")
            mark = group.bus.mark()
            t0 = await asyncio.to_thread(_depose, impl, ctx.servers, group, lead)
            stop = await group.bus.wait_for(_stopped(lead), impl.deposed_window, mark)
            if stop is None:
                part.never += 1
            else:
                part.values.append(max(stop.ns - t0, 0) / 1e9)
        finally:
            await group.close()
        return part

    out = Outcome(window=impl.deposed_window)
    for part in await _gather(one(rep) for rep in range(ctx.reps)):
        out.merge(part)
    return out


# --- 5. idle cost -----------------------------------------------------------------------------------------


@dataclass
class _Snap:
    t: float
    server: dict[str, float]
    cpu: float
    mem: float


async def _snap(ctx: Ctx, backend: str, pid: int | None) -> _Snap:
    def take() -> _Snap:
        cpu, mem = process_usage(pid) if pid is not None else (0.0, 0.0)
        return _Snap(time.monotonic(), ctx.servers.counters(backend), cpu, mem)

    return await asyncio.to_thread(take)


#: Gauges, not counters: reported as they stand at the end of a window.
_GAUGES = ("Threads_connected", "connected", "connected_clients")


def _rates(a: _Snap, b: _Snap, own: dict[str, float]) -> dict[str, float]:
    dt = b.t - a.t
    keys = (set(a.server) | set(b.server)) - set(_GAUGES)
    return {k: (b.server.get(k, 0.0) - a.server.get(k, 0.0) - own.get(k, 0.0)) / dt for k in sorted(keys)}


async def idle(impl: Impl, ctx: Ctx) -> Outcome:
    """One leader, then 20 and 100 waiting candidates in one process: server requests, CPU and memory."""
    out = Outcome()
    small, large = ctx.idle_counts
    w0, w_small, w_large = ctx.idle_windows
    group = Group(impl.module, impl.election("idle", 0), _args(impl, ctx), ctx.log_dir / impl.key, "idle")
    try:
        leader = await group.spawn()
        if not await group.wait_campaigning(leader, 1, ctx.start_timeout) or await group.wait_leader(30) is None:
            raise SetupError(f"leader did not start: {_log_tail(leader.log_path)}")
        await asyncio.sleep(1.0)
        s0 = await _snap(ctx, impl.backend, leader.pid)
        await asyncio.sleep(w0)
        s1 = await _snap(ctx, impl.backend, leader.pid)
        own = ctx.servers.own_requests(impl.backend)
        base = _rates(s0, s1, own)
        out.metrics["leader"] = {"rates": base, "cpu_pct": 100 * (s1.cpu - s0.cpu) / (s1.t - s0.t)}
        followers = await group.spawn(slots=small)
        for count, window in ((small, w_small), (large, w_large)):
            if count > small:
                followers.send(f"add {count - small}")
            if not await group.wait_campaigning(followers, count, 90.0):
                raise SetupError(
                    f"only {group.campaigning(followers)} of {count} candidates campaigning: "
                    f"{_log_tail(followers.log_path)}"
                )
            await asyncio.sleep(3.0)  # connections and watches set up
            errors_before = sum(1 for e in group.bus.events if e.kind == "ERROR")
            a = await _snap(ctx, impl.backend, followers.pid)
            await asyncio.sleep(window)
            b = await _snap(ctx, impl.backend, followers.pid)
            rates = _rates(a, b, own)
            per = {k: (v - base.get(k, 0.0)) / count for k, v in rates.items()}
            leaders = [e for e in group.bus.events if e.kind == "LEADER" and e.proc is followers]
            out.metrics[str(count)] = {
                "window": b.t - a.t,
                "rates": rates,
                "per_candidate": per,
                "cpu_pct": 100 * (b.cpu - a.cpu) / (b.t - a.t),
                "mem_mib": b.mem,
                "errors": sum(1 for e in group.bus.events if e.kind == "ERROR") - errors_before,
                "followers_leading": len(leaders),
                "gauges": {k: v for k, v in b.server.items() if k in _GAUGES},
            }
        errs = [e.detail for e in group.bus.events if e.kind == "ERROR"]
        if errs:
            out.errors.append(f"{len(errs)} candidate errors, e.g. {errs[0][:160]}")
    finally:
        await group.close()
    return out


# --- 6. handoff rate ------------------------------------------------------------------------------------------


async def handoff(impl: Impl, ctx: Ctx) -> Outcome:
    """Two candidates that release as soon as they lead: handoffs per second for ``handoff_seconds``."""
    out = Outcome()
    group = Group(impl.module, impl.election("handoff", 0), _args(impl, ctx), ctx.log_dir / impl.key, "handoff")
    try:
        procs = [await group.spawn(extra=("--pingpong",)) for _ in range(2)]
        for proc in procs:
            if not await group.wait_campaigning(proc, 1, ctx.start_timeout):
                raise SetupError(f"{proc.label} did not start: {_log_tail(proc.log_path)}")
        await asyncio.sleep(0.5)
        before = await _snap(ctx, impl.backend, None)
        t_start = now_ns()
        await asyncio.sleep(ctx.handoff_seconds)
        t_end = now_ns()
        after = await _snap(ctx, impl.backend, None)
        for proc in procs:
            proc.kill_tree()
        own = ctx.servers.own_requests(impl.backend)
        requests = {
            k: after.server.get(k, 0.0) - before.server.get(k, 0.0) - own.get(k, 0.0)
            for k in set(after.server) - set(_GAUGES)
        }
        events = [e for e in group.bus.events if t_start <= e.ns < t_end]
        leaders = [e for e in events if e.kind == "LEADER"]
        handoffs = sum(1 for x, y in itertools.pairwise(leaders) if x.proc is not y.proc)
        # Mutual exclusion as the clients saw it: a new LEADER before the previous one's RELEASING.
        overlaps = 0
        last_end: dict[int, int] = {}
        holder: Event | None = None
        for e in sorted(events, key=lambda e: e.ns):
            if e.kind == "LEADER":
                if holder is not None and holder.proc is not e.proc and last_end.get(id(holder.proc), 0) < holder.ns:
                    overlaps += 1
                holder = e
            elif e.kind in ("RELEASING", "STOPPED"):
                last_end[id(e.proc)] = e.ns
        seconds = (t_end - t_start) / 1e9
        out.values.append(handoffs / seconds)
        out.metrics = {
            "seconds": seconds,
            "leaderships": len(leaders),
            "handoffs": handoffs,
            "repeats": max(len(leaders) - 1 - handoffs, 0),
            "overlaps": overlaps,
            "errors": sum(1 for e in events if e.kind == "ERROR"),
            "requests": requests,
        }
    finally:
        await group.close()
    return out


# --- 7. blocked event loop ---------------------------------------------------------------------------


async def blocked(impl: Impl, ctx: Ctx) -> Outcome:
    """The longest synchronous block of the leader's event loop (1.5 s after it leads) that keeps leadership.

    Steps ``B`` by ``ctx.block_step`` from ``ctx.block_step``: a fresh pair of candidates per step, the leader
    blocks once, and 2 s after it wakes it must still act, with no other leader meanwhile. Stops at the first
    step that loses (or at ``ctx.block_max``); ``values`` holds the longest block kept.
    """
    out = Outcome(window=ctx.block_max)
    kept: list[float] = []
    lost_at = 0.0
    steps = round(ctx.block_max / ctx.block_step)
    for step in range(1, steps + 1):
        block = step * ctx.block_step
        group = await _start_group(impl, ctx, "blocked", step, 2)
        try:
            lead = await group.wait_leader(ctx.start_timeout)
            if lead is None:
                raise SetupError("no leader to block")
            await asyncio.sleep(1.5)
            mark = group.bus.mark()
            lead.proc.send(f"block {lead.slot} {block:g}")
            woke = await group.bus.wait_for(_from(lead, "WOKE"), block + 10, mark)
            if woke is None:
                raise SetupError(f"the leader did not wake from a {block:g}s block")
            await asyncio.sleep(2.0)
            events = group.bus.events[mark:]
            other = any(_other_leader(lead)(e) for e in events)
            stopped = any(_stopped(lead)(e) for e in events)
            acting = any(_same(e, lead) and e.kind == "ACT" and e.ns >= woke.ns + 1_900_000_000 for e in events)
        finally:
            await group.close()
        if other or stopped or not acting:
            lost_at = block
            break
        kept.append(block)
    out.values = [max(kept)] if kept else []
    out.metrics = {"kept": kept, "lost_at": lost_at or None, "step": ctx.block_step}
    out.note = f"longest block kept {max(kept, default=0):g}s" + (f"; lost at {lost_at:g}s" if lost_at else "")
    return out


SCENARIOS = {
    "graceful": graceful,
    "crash": crash,
    "frozen": frozen,
    "deposed": deposed,
    "idle": idle,
    "handoff": handoff,
    "blocked": blocked,
}
