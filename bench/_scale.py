"""Scale: N elections at once, each with the same 3 candidate processes campaigning in every one.

For N in ``ctx.scale_counts`` three processes host N slots each (``--spread``:
slot *i* of every process campaigns in election *i*). Slots are added in
batches of ``ctx.scale_batch`` per process, the next batch only once every
election so far has a leader, so at most 3 x batch campaigns connect at once.
Once all N elections lead, over ``ctx.scale_window`` seconds: the server's
request counters, what it holds (connections; etcd: leases, watch streams,
watchers), and the three processes' CPU and memory. Then a few elections
(first, middle, last) hand over gracefully: their leader is told to release,
timed to the next LEADER of that election. Every wait is bounded; an N that
does not reach a leader in every election is reported with what stopped it,
and larger N are not tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from ._driver import CandidateProc, Event, Group
from ._impls import Impl
from ._scenarios import Ctx, Outcome, SetupError
from ._servers import Servers, process_usage

__all__ = ["scale"]

PROCESSES = 3
#: Give up starting an N when no election got its first leader for this long.
STALL = 20.0


@dataclass
class _Tracker:
    """Who leads each election (slot index), read incrementally from the group's lines."""

    group: Group
    seen: int = 0
    leads: dict[int, CandidateProc] = field(default_factory=dict)
    ever_led: set[int] = field(default_factory=set)
    campaigning: set[tuple[int, int]] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    exited: bool = False
    last_progress: float = field(default_factory=time.monotonic)

    def update(self) -> None:
        events = self.group.bus.events
        for e in events[self.seen :]:
            if e.kind == "LEADER":
                self.leads[e.slot] = e.proc
                if e.slot not in self.ever_led:
                    self.ever_led.add(e.slot)
                    self.last_progress = time.monotonic()
            elif e.kind in ("RELEASING", "STOPPED"):
                if self.leads.get(e.slot) is e.proc:
                    del self.leads[e.slot]
            elif e.kind == "CAMPAIGN":
                self.campaigning.add((id(e.proc), e.slot))
            elif e.kind == "ERROR":
                self.errors.append(e.detail)
            elif e.kind == "EXITED":
                self.exited = True
                for slot in [s for s, p in self.leads.items() if p is e.proc]:
                    del self.leads[slot]
        self.seen = len(events)

    async def wait_started(self, elections: int, deadline: float) -> bool:
        """Until elections 0..elections-1 each had a leader and every slot campaigns; False on stall or exit."""
        while True:
            self.update()
            if len(self.ever_led) >= elections and len(self.campaigning) >= PROCESSES * elections:
                return True
            now = time.monotonic()
            if self.exited or now > deadline or now - self.last_progress > STALL:
                return False
            await self.group.bus.wait_for(lambda e: True, 0.5, self.group.bus.mark())


def _client_connections(pids: list[int], port: int) -> int:
    count = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            count += sum(1 for c in psutil.Process(pid).net_connections(kind="tcp") if c.raddr and c.raddr.port == port)
    return count


def _usage(pids: list[int]) -> tuple[float, float]:
    cpu = mem = 0.0
    for pid in pids:
        c, m = process_usage(pid)
        cpu, mem = cpu + c, mem + m
    return cpu, mem


async def _handovers(group: Group, tracker: _Tracker, n: int, samples: int) -> tuple[list[float], int]:
    """Graceful handovers of a few elections that had a leader (first, middle, last): (seconds each, how many
    did not hand over within 10 s)."""
    values: list[float] = []
    missed = 0
    started = sorted(tracker.ever_led) or list(range(n))
    for k in sorted({started[0], started[len(started) // 2], started[-1]})[:samples]:
        tracker.update()
        lead = tracker.leads.get(k)
        if lead is None:
            missed += 1
            continue
        mark = group.bus.mark()
        lead.send(f"release {k}")

        def mine(e: Event, lead: CandidateProc = lead, k: int = k) -> bool:
            return e.slot == k and e.proc is lead

        rel = await group.bus.wait_for(lambda e, f=mine: f(e) and e.kind == "RELEASING", 5.0, mark)
        new = await group.bus.wait_for(
            lambda e, lead=lead, k=k: e.kind == "LEADER" and e.slot == k and e.proc is not lead, 10.0, mark
        )
        if rel is None or new is None:
            missed += 1
        else:
            values.append((new.ns - rel.ns) / 1e9)
        await group.bus.wait_for(lambda e, f=mine: f(e) and e.kind in ("RELEASED", "ERROR"), 5.0, mark)
        lead.send(f"campaign {k}")
        await asyncio.sleep(0.2)
    return values, missed


async def _one(impl: Impl, ctx: Ctx, servers: Servers, n: int) -> dict[str, Any]:
    args = ["--url", servers.url(impl.backend), "--ttl", "5", *impl.extra_args]
    group = Group(impl.module, impl.election("scale", n), args, ctx.log_dir / impl.key, f"scale-{n}")
    tracker = _Tracker(group)
    row: dict[str, Any] = {"elections": n}
    base_state = await asyncio.to_thread(servers.state, impl.backend)
    try:
        procs = [await group.spawn(slots=0, extra=("--spread", "--act-ms", "1000")) for _ in range(PROCESSES)]
        t0 = time.monotonic()
        deadline = t0 + ctx.scale_start_timeout
        added = 0
        started = True
        while added < n and started:
            batch = min(ctx.scale_batch, n - added)
            for proc in procs:
                proc.send(f"add {batch}")
            added += batch
            started = await tracker.wait_started(added, deadline)
        row["start_s"] = time.monotonic() - t0
        row["led"] = len(tracker.ever_led)
        if not started:
            tracker.update()
            example = tracker.errors[0][:200] if tracker.errors else "no error printed"
            row["limit"] = (
                f"{len(tracker.ever_led)} of {n} elections led, {len(tracker.campaigning)} of"
                f" {PROCESSES * n} candidates campaigning after {row['start_s']:.0f} s;"
                f" {len(tracker.errors)} errors, e.g. {example}"
            )
        await asyncio.sleep(ctx.scale_settle)
        pids = [p.pid for p in procs]
        errors_before = len(tracker.errors)
        a_counters = await asyncio.to_thread(servers.counters, impl.backend)
        a_t, (a_cpu, _) = time.monotonic(), await asyncio.to_thread(_usage, pids)
        await asyncio.sleep(ctx.scale_window)
        b_counters = await asyncio.to_thread(servers.counters, impl.backend)
        b_t, (b_cpu, mem) = time.monotonic(), await asyncio.to_thread(_usage, pids)
        state = await asyncio.to_thread(servers.state, impl.backend)
        port = {"mysql": servers.mariadb, "etcd": servers.etcd, "postgres": servers.postgres}.get(impl.backend)
        if port is not None:
            row["client_connections"] = await asyncio.to_thread(_client_connections, pids, port.port)
        own = servers.own_requests(impl.backend)
        dt = b_t - a_t
        row["window"] = dt
        row["rates"] = {
            k: (b_counters.get(k, 0.0) - a_counters.get(k, 0.0) - own.get(k, 0.0)) / dt
            for k in b_counters
            if k not in ("Threads_connected", "connected")
        }
        row["cpu_pct"] = 100 * (b_cpu - a_cpu) / dt
        row["load"] = os.getloadavg()[0]
        row["mem_mib"] = mem
        row["state"] = {k: v - base_state.get(k, 0.0) for k, v in state.items()}
        server_pid = servers.server_pid(impl.backend)
        if server_pid is not None:
            # The server and its children (PostgreSQL: one process per session).
            row["server_mem_mib"] = (await asyncio.to_thread(process_usage, server_pid))[1]
        tracker.update()
        row["errors_in_window"] = len(tracker.errors) - errors_before
        # Elections with a leader at the end of the window (fewer than N: leaderships lost and not yet regained).
        row["leading_now"] = len(tracker.leads)
        row["handover"], row["handover_missed"] = await _handovers(group, tracker, n, ctx.scale_samples)
        tracker.update()
        row["errors"] = len(tracker.errors)
        if tracker.errors:
            row["error_example"] = tracker.errors[0][:200]
    finally:
        # Asked to quit first, so that etcd leases are revoked rather than left to expire into the next N.
        await asyncio.gather(*(p.close(grace=8.0) for p in group.procs), return_exceptions=True)
    return row


async def scale(impl: Impl, ctx: Ctx) -> Outcome:
    """N = ``ctx.scale_counts`` elections held by 3 processes: per-election cost and handover latency."""
    out = Outcome()
    servers = ctx.scale_servers or ctx.servers
    for n in ctx.scale_counts:
        print(f"    {impl.key} scale N={n}", flush=True)
        try:
            row = await asyncio.wait_for(_one(impl, ctx, servers, n), ctx.scale_start_timeout + 90)
        except (TimeoutError, SetupError, OSError) as exc:
            out.errors.append(f"N={n}: {type(exc).__name__}: {exc}"[:300])
            break
        out.metrics[str(n)] = row
        out.values += row.get("handover", [])
        if "limit" in row:
            break
    return out
