"""``python -m soak.adversary``: run the adversary seed after seed against real servers; exit 1 on a violation.

``--seed`` is the first seed (random if not given); seeds follow one another
(``seed``, ``seed + 1``...) until ``--minutes`` are up or ``--seeds`` have
run. Each backend gets its own throwaway server, started once.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time

import anyio

from .run import Outcome, run_seed
from .servers import SERVERS, Target
from .shards import run_shards
from .stops import STOP_BACKENDS, run_stops

_NS = 1_000_000_000
#: The targets whose nodes are split from each other (several servers): sharded leadership is not played there.
SPLIT = ("redis-sentinel", "etcd-cluster", "redis-cluster")


def describe(outcome: Outcome, trace: float = 0.0, *, full: bool = False) -> str:
    """One line for the seed, then one per violation; with ``trace``, what happened that many seconds before."""
    counts = ", ".join(f"{k} {v}" for k, v in sorted(outcome.counts.items()))
    state = "ok" if outcome.ok else f"{len(outcome.violations)} VIOLATION(S)"
    lines = [f"{outcome.backend} seed {outcome.seed}: {state} ({counts}; slow: {', '.join(outcome.slow) or '-'})"]
    for violation in outcome.violations:
        lines.append(f"  {violation.kind}: {violation.message}")
    if full:
        begin = outcome.trace[0][0] if outcome.trace else 0
        lines += [f"    {(t - begin) / _NS:8.3f} {who:>8} {what}" for t, who, what in outcome.trace]
    elif not outcome.ok and trace:
        first = min((v.at for v in outcome.violations if v.at is not None), default=None)
        if first is not None:
            lines.append("  trace (seconds from the first violation):")
            for t, who, what in outcome.trace:
                if -trace <= (t - first) / _NS <= 2.0:
                    lines.append(f"    {(t - first) / _NS:+8.3f} {who:>8} {what}")
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> int:
    backends = list(SERVERS) if args.backend == "all" else [args.backend]
    if args.shards:
        backends = [b for b in backends if b not in SPLIT]
    if args.stops:
        backends = [b for b in backends if b in STOP_BACKENDS]
    if args.fenced:
        from .fenced import FREEZE  # not at the top: the library before a fix (old/) lacks what it imports

        backends = [b for b in backends if b in FREEZE]
    first = args.seed if args.seed is not None else random.randrange(1_000_000)
    failed = 0
    kinds: dict[str, int] = {}  # the operator's faults, by kind, over every seed
    for backend in backends:
        target: Target = SERVERS[backend](f"adversary-{first}")
        await anyio.to_thread.run_sync(target.start)
        try:
            deadline = time.monotonic() + args.minutes * 60
            seed = first
            while time.monotonic() < deadline and (args.seeds is None or seed < first + args.seeds):
                target.name = f"adversary-{seed}"
                if args.shards:
                    outcome = await run_shards(target, seed, args.seconds, instances=args.electors)
                elif args.stops:
                    outcome = await run_stops(target, seed, args.seconds, supervisors=args.electors)
                elif args.fenced:
                    from .fenced import run_fenced

                    outcome = await run_fenced(target, seed, args.seconds, electors=args.electors)
                else:
                    outcome = await run_seed(
                        target, seed, args.seconds, electors=args.electors, handovers=args.handovers
                    )
                print(describe(outcome, args.trace, full=args.full_trace), flush=True)
                for fault in outcome.faults:
                    kinds[fault.kind] = kinds.get(fault.kind, 0) + 1
                    if "(failed over)" in fault.detail:  # a split the other nodes answered with a failover
                        kinds[f"{fault.kind} failed over"] = kinds.get(f"{fault.kind} failed over", 0) + 1
                failed += not outcome.ok
                seed += 1
        finally:
            await anyio.to_thread.run_sync(target.cleanup)
    print("counts per fault kind: " + (", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"), flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.adversary")
    parser.add_argument("--backend", default="all", choices=["all", *SERVERS])
    parser.add_argument("--seed", type=int, default=None, help="the first seed (default: random)")
    parser.add_argument("--seeds", type=int, default=None, help="how many seeds at most (default: until --minutes)")
    parser.add_argument("--minutes", type=float, default=20.0, help="per backend")
    parser.add_argument("--seconds", type=float, default=20.0, help="each seed's run")
    parser.add_argument("--electors", type=int, default=None, help="default: 3 to 6, drawn by each seed")
    parser.add_argument(
        "--shards", action="store_true", help="Shards instances owning 8 names (soak/adversary/shards.py)"
    )
    parser.add_argument(
        "--stops",
        action="store_true",
        help="aioelect run supervisors, every process of theirs stopped and continued (soak/adversary/stops.py)",
    )
    parser.add_argument(
        "--fenced",
        action="store_true",
        help="each leader does a fenced write, some frozen past the lease with it in flight (soak/adversary/fenced.py)",
    )
    parser.add_argument(
        "--handovers", action="store_true", help="the operator also steps leaders down (soak/adversary/handovers.py)"
    )
    parser.add_argument("--trace", type=float, default=10.0, help="seconds of trace shown before a violation")
    parser.add_argument("--full-trace", action="store_true", help="the whole trace of every seed")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.shards and args.backend in SPLIT:
        parser.error(f"--shards runs on one server: not on {args.backend}")
    logging.basicConfig(
        stream=sys.stderr, level=logging.DEBUG if args.verbose else logging.ERROR, format="%(asctime)s %(message)s"
    )
    return anyio.run(_main, args)


if __name__ == "__main__":
    sys.exit(main())
