"""``python -m soak --stops``: the stopped-processes workload of the adversary (:mod:`soak.adversary.stops`) for
minutes, on etcd and PostgreSQL side by side: ``aioelect run --forever`` supervisors whose every process (the
supervisor, its shim, CMD, a worker, a setsid worker) is SIGSTOPped and SIGCONTed at random, CMDs that stop their
own shim, a leader deposed every few seconds. Writes ``stops-report.md`` (faults by kind, leaderships, the longest
time a tree worked after the next one started against the margin, the violations) into the output directory.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import anyio

from tests.harness import MissingBinaryError

from .adversary.__main__ import describe
from .adversary.run import Outcome
from .adversary.servers import SERVERS
from .adversary.stops import run_stops
from .report import _commit

__all__ = ["BACKENDS", "soak_stops"]

#: The backends the workload runs on, side by side.
BACKENDS = ("etcd", "postgres")


def _one(
    backend: str, seed: int, seconds: float, outcomes: dict[str, Outcome], failures: dict[str, BaseException]
) -> None:
    target = SERVERS[backend](f"soak-stops-{seed}")
    try:
        target.start()
        outcomes[backend] = anyio.run(run_stops, target, seed, seconds)
    except BaseException as exc:
        failures[backend] = exc
    finally:
        target.cleanup()


def report(seed: int, minutes: float, wall: float, outcomes: list[Outcome]) -> str:
    """The markdown report: one row per backend, then each backend's violations with the trace before them."""
    ok = all(o.ok for o in outcomes)
    lines = [
        f"`make soak STOPS=1 SEED={seed} MINUTES={minutes:g}` on commit `{_commit()}`: "
        f"**{'passed' if ok else 'FAILED'}** "
        f"({wall / 60:.1f} minutes of wall time, the backends side by side).",
        "",
        "| backend | verdict | faults by kind | CMDs that stopped their shim | leaderships "
        "| longest work after the next CMD started (margin) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        faults = ", ".join(f"{k} {n}" for k, n in sorted(o.counts.items()) if k.startswith(("stop-", "depose")))
        verdict = "pass" if o.ok else f"FAIL: {len(o.violations)} violation(s)"
        lines.append(
            f"| {o.backend} | {verdict} | {faults} | {o.counts.get('cmd stops its shim', 0)} "
            f"| {o.counts.get('leadership', 0)} | {o.verdict.max_overlap:.2f} s ({o.verdict.margin:.2f} s) |"
        )
    for o in outcomes:
        if not o.ok:
            lines += ["", f"Violations on {o.backend}:", "", "```", describe(o, trace=10.0), "```"]
    return "\n".join(lines) + "\n"


def soak_stops(seed: int, minutes: float, out: Path, backends: tuple[str, ...] = BACKENDS) -> int:
    """Run the workload on ``backends`` for ``minutes`` each, side by side; 0 if it passed, 1 on a violation, 2 if
    a server could not be started."""
    started = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    failures: dict[str, BaseException] = {}
    threads = [
        threading.Thread(target=_one, args=(b, seed, minutes * 60, outcomes, failures), name=f"soak-stops-{b}")
        for b in backends
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = [outcomes[b] for b in backends if b in outcomes]
    text = report(seed, minutes, time.monotonic() - started, done)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stops-report.md").write_text(text, encoding="utf-8")
    print(text)
    for backend, error in failures.items():
        print(f"soak: stops on {backend} could not run: {error!r}")
    if any(isinstance(e, MissingBinaryError) for e in failures.values()):
        return 2
    return 0 if not failures and all(o.ok for o in done) else 1
