"""``python -m bench``: run every implementation through every scenario, write RESULTS.md and the chart.

Options: ``--quick`` (a smoke run of a couple of minutes), ``--only KEY,...``
(implementations), ``--backend NAME,...`` (the implementations of these backends only: its
report goes to ``bench/out/<backends>/RESULTS.md``, RESULTS.md is left as it is),
``--scenarios NAME,...``, ``--reps N``, ``--scale N,...`` (election counts),
``--report-only`` (re-render from ``bench/out/results.json``).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
# Import names of what bench/requirements.txt installs.
NEEDED = ("tooz", "etcd3gw", "psycopg2", "matplotlib", "psutil", "redis", "redis_lock", "pottery")


def ensure_requirements() -> None:
    """Install the peers and tools of bench/requirements.txt into this interpreter's environment if missing."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if not missing:
        return
    print(f"bench: installing {', '.join(missing)} from {REQUIREMENTS.name} (bench only, not aioelect's deps)")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)], check=True, timeout=600
    )
    importlib.invalidate_caches()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer repetitions, shorter windows")
    parser.add_argument("--only", default="", help="comma-separated implementation keys")
    parser.add_argument(
        "--backend",
        default="",
        help="comma-separated backends (mysql, etcd, postgres, redis, file): their implementations only, reported"
        " in bench/out/<backends>/RESULTS.md",
    )
    parser.add_argument("--scenarios", default="", help="comma-separated scenarios")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--scale", default="", help="comma-separated election counts of the scale scenario")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--budget", type=float, default=1500.0, help="seconds before remaining scenarios are skipped")
    parser.add_argument("--no-install", action="store_true")
    args = parser.parse_args()
    if not args.no_install:
        ensure_requirements()
    from ._run import run

    return run(args, argv=sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
