"""Scenarios measured by one worker process (``python -m bench.probes``): round trips and cold starts."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from ._driver import REPO
from ._impls import Impl
from ._scenarios import Ctx, Outcome

__all__ = ["coldstart", "inproc", "rtt"]


async def _probe(args: list[str], timeout: float) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.probes",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await asyncio.wait_for(proc.wait(), 10)
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"bench.probes {args[0]} exited {proc.returncode}: {err.decode()[-300:]}")
    data = json.loads(out.decode().strip().splitlines()[-1])
    assert isinstance(data, dict)
    return data


async def rtt(impl: Impl, ctx: Ctx) -> Outcome:
    """One server round trip of ``impl``'s backend (a trivial request), measured beside the scenarios."""
    if impl.backend == "file":
        return Outcome(skipped="no server")
    data = await _probe(
        ["rtt", "--backend", impl.backend, "--url", ctx.servers.url(impl.backend), "--count", str(ctx.rtt_count)],
        120,
    )
    first = next(iter(data.values()))
    return Outcome(values=[first["median"]], metrics=data)


async def coldstart(impl: Impl, ctx: Ctx) -> Outcome:
    """A new candidate constructed, connected and leading an empty election: seconds, one per repetition."""
    return await _candidate_probe("coldstart", impl, ctx)


async def inproc(impl: Impl, ctx: Ctx) -> Outcome:
    """Graceful handovers between two candidates in one process: seconds, one per repetition."""
    return await _candidate_probe("inproc", impl, ctx)


async def _candidate_probe(what: str, impl: Impl, ctx: Ctx) -> Outcome:
    data = await _probe(
        [
            what,
            "--module",
            impl.module,
            "--url",
            ctx.servers.url(impl.backend),
            "--name",
            impl.election(what, 0),
            "--reps",
            str(ctx.coldstart_reps),
            *impl.extra_args,
        ],
        30 + 25 * (ctx.coldstart_reps + 1),
    )
    metrics = {"release": data["release"]} if "release" in data else {}
    return Outcome(values=data["values"], errors=data["errors"][:3], metrics=metrics)
