"""One backend's soak: its server(s), 3 to 5 candidates, the nemesis, a clean stop, and what was left behind.

:func:`run_backend` returns the recorded :class:`~soak.checker.History` (and
what the report shows besides); it judges nothing itself. Every process and
server it starts is stopped in a ``finally``.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.harness import PostgresServer

from . import register
from .checker import History
from .nemesis import Nemesis, Planned, plan
from .pool import Pool
from .targets import make_target
from .timing import SHARD_NAMES, TIMINGS

__all__ = ["BackendRun", "run_backend"]

#: How long the first leader may take after the candidates start.
_FIRST_LEADER = 60.0
#: How long candidates get to exit after SIGTERM.
_STOP = 20.0


@dataclass
class BackendRun:
    """What one backend's run recorded."""

    label: str
    history: History
    schedule: list[Planned]
    skipped: list[str]
    candidates: int
    directory: Path
    began: int  # monotonic ns: t = 0 of the timeline
    #: (candidate, event) of every leadership lost or released (with its reason), and of every write not made
    #: because ``held`` read False.
    losses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def run_backend(
    label: str, *, seed: int, seconds: float, out: Path, register_server: PostgresServer, register_dsn: str
) -> BackendRun:
    """Run ``label``'s soak for ``seconds`` (faults, then a quiet end) and return what was recorded."""
    backend, timing = TIMINGS[label]
    name = f"soak-{label}"
    directory = out / label
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("c*.*"):
        old.unlink()
    target = make_target(label, name)
    names = SHARD_NAMES if target.shards else ()
    keys = [f"{label}/{n}" for n in names] or [label]  # the register rows: one per name, or the backend's
    pool: Pool | None = None
    errors: list[str] = []
    try:
        target.start()
        for key in keys:
            register.create(register_server, key)
        pool = Pool(
            backend=backend,
            name=name,
            options=timing.options,
            register_dsn=register_dsn,
            key=label,
            upstreams=target.upstreams(),
            target_for=target.candidate_target,
            directory=directory,
            seed=seed,
            names=names,
        )
        count = random.Random(f"{seed}:{label}:candidates").randint(3, 5)
        for _ in range(count):
            pool.start()
        if pool.wait_leader(_FIRST_LEADER) is None:
            errors.append(f"no leader within {_FIRST_LEADER:.0f} s of the start")
        began = time.monotonic()
        began_ns = time.monotonic_ns()
        schedule = plan(seed, label, target.fault_kinds, seconds, timing.lease)
        nemesis = Nemesis(target, pool, timing)
        nemesis.run(schedule, began)
        time.sleep(max(0.0, began + seconds - time.monotonic()))
        end_ns = time.monotonic_ns()
        stopped = {c.identity for c in pool.live()}
        leftovers = pool.stop_all(_STOP)
        leftovers += pool.exit_reports(stopped)
        # Killed candidates' sessions end with their lease: wait that long (and a little) for the server to tidy.
        deadline = time.monotonic() + timing.lease + 5.0
        while True:
            left = target.leftovers()
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        leftovers += left + pool.still_running()
        history = History(
            label=label,
            acts=pool.acts(),
            writes=[w for key in keys for w in register.history(register_server, key)],
            faults=sorted(nemesis.faults, key=lambda f: f.start),
            begin=began_ns,
            end=end_ns,
            margin=timing.margin,
            base_gap=timing.base_gap,
            leftovers=leftovers,
            errors=errors + nemesis.errors,
            names=list(names),
        )
        (directory / "nemesis.log").write_text("\n".join(nemesis.tracebacks), encoding="utf-8")
        with open(directory / "faults.jsonl", "w", encoding="utf-8") as fh:
            for fault in history.faults:
                fh.write(json.dumps(asdict(fault)) + "\n")
        losses = [(c.identity, e) for c in pool.all for e in c.events if e["e"] in ("lost", "released", "unheld")]
        return BackendRun(label, history, schedule, nemesis.skipped, len(pool.all), directory, began_ns, losses)
    finally:
        if pool is not None:
            pool.close()
        target.cleanup()
