"""``python -m soak --minutes M [--seed S] [--out DIR] [--backends mariadb,postgres,redis,etcd1,etcd3] [--shards]``.

``--stops`` runs the stopped-processes workload instead (``aioelect run`` supervisors whose every process is
stopped and continued at random; :mod:`soak.stops`) on etcd and PostgreSQL.

``--splits`` runs the split workload (server nodes in network namespaces of their own, split from each other;
:mod:`soak.splits`) on ``sentinel-split`` and ``etcd3-split`` instead; it needs root.

``--shards`` runs the shards workload (``aioelect.Shards`` over 12 names, a register row per name) on
``shards-etcd`` and ``shards-postgres`` instead of the single election.

Runs the backends side by side, each for the full ``--minutes``; exits 1 if
the checker finds any violation, 2 if a server cannot be started.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from tests.harness import MissingBinaryError, PostgresServer

from . import register, report
from .checker import check
from .runner import BackendRun, run_backend
from .timing import ELECTION_LABELS, SHARDS_LABELS, SPLIT_LABELS, TIMINGS


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=20.0, help="length of each backend's run (default 20)")
    parser.add_argument("--seed", type=int, default=None, help="replays a schedule (default: a random one, printed)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out", help="output directory")
    parser.add_argument(
        "--backends",
        default=None,
        help=f"comma-separated, of {', '.join(TIMINGS)} (default: {','.join(ELECTION_LABELS)})",
    )
    parser.add_argument(
        "--shards",
        action="store_true",
        help=f"the shards workload: default backends {','.join(SHARDS_LABELS)}",
    )
    parser.add_argument(
        "--splits",
        action="store_true",
        help=f"the split workload (server nodes split from each other, root): backends {','.join(SPLIT_LABELS)}",
    )
    parser.add_argument(
        "--stops",
        action="store_true",
        help="the stopped-processes workload (aioelect run supervisors, every process stopped and continued)",
    )
    args = parser.parse_args(argv)
    if args.backends is None:
        default = SHARDS_LABELS if args.shards else SPLIT_LABELS if args.splits else ELECTION_LABELS
        args.backends = ",".join(default)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backends) - set(TIMINGS)
    if unknown:
        parser.error(f"unknown backends: {sorted(unknown)}")
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "big")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out: Path = args.out
    if args.stops:
        from .stops import soak_stops

        print(f"soak: seed {args.seed}, {args.minutes:g} minutes of stopped processes; output in {out}", flush=True)
        return soak_stops(args.seed, args.minutes, out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(
        f"soak: seed {args.seed}, {args.minutes:g} minutes on {', '.join(args.backends)}; output in {out}", flush=True
    )
    try:
        register_server = PostgresServer()
    except MissingBinaryError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    runs: dict[str, BackendRun] = {}
    failures: dict[str, BaseException] = {}

    def one(label: str) -> None:
        try:
            runs[label] = run_backend(
                label,
                seed=args.seed,
                seconds=args.minutes * 60,
                out=out,
                register_server=register_server,
                register_dsn=register_server.dsn,
            )
        except BaseException as exc:
            failures[label] = exc

    try:
        register_server.start()
        register.create_tables(register_server)  # once: the backends' threads only add their rows
        threads = [threading.Thread(target=one, args=(label,), name=f"soak-{label}") for label in args.backends]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        register_server.cleanup()
    for label, error in failures.items():
        print(f"soak: {label} could not run: {error!r}", file=sys.stderr)
    done = [runs[label] for label in args.backends if label in runs]
    verdicts = [check(run.history) for run in done]
    wall = time.monotonic() - started
    report.write_all(out, args.seed, args.minutes, wall, done, verdicts)
    print("\n".join(report.summary_lines(verdicts)))
    for verdict in verdicts:
        for violation in verdict.violations:
            print(f"soak: {verdict.label}: VIOLATION {violation.kind}: {violation.message}")
    ok = not failures and all(v.ok for v in verdicts)
    word = "PASS" if ok else "FAIL"
    print(f"soak: seed {args.seed}: {word} in {wall:.0f} s; see {out}/report.md, timeline.txt, soak.svg")
    if failures and any(isinstance(e, MissingBinaryError) for e in failures.values()):
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
