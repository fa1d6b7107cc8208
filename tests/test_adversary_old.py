"""The adversary's CI seeds find the bug a fix removed, when run on the library as it was before that fix.

``scripts/adversary-old.sh`` checks the commit before the fix out in a
worktree of its own, with only the interceptor seam the adversary plugs into
(``soak/adversary/old/``), and runs today's adversary against it. A seed that
finds a violation exits with status 1 and names it; one that finds nothing
exits with 0. Here: MySQL's CI seeds against the library before the fix of a
lock session, kept across a server restart, that KILLed by its old connection
id the session the restarted server had given that id (a healthy leader
deposed). The etcd bug of docs/adversary.md ("Shown to find") is found by
the etcd CI seeds in about two runs of three, too seldom for a test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.plugin import skip_if_external

from .test_adversary import SECONDS, SEEDS

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "adversary-old.sh"


@pytest.mark.timeout(400)
def test_mysql_ci_seeds_find_the_kept_session_kill_on_the_library_before_its_fix(tmp_path: Path) -> None:
    skip_if_external("mysql")
    old = tmp_path / "old"
    env = {**os.environ, "ADVERSARY_OLD": str(old), "PYTHON": sys.executable}
    found: dict[int, str] = {}
    try:
        for seed in SEEDS["mysql"]:
            argv = ["bash", str(SCRIPT), "mysql-kill", "--backend", "mysql", "--seed", str(seed), "--seeds", "1"]
            argv += ["--seconds", str(SECONDS)]
            run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
            # 0: nothing found; 1: a violation; anything else: the run itself broke.
            assert run.returncode in (0, 1), f"seed {seed}: exit {run.returncode}\n{run.stderr[-3000:]}"
            deposed = [line.strip() for line in run.stdout.splitlines() if line.strip().startswith("deposed:")]
            if run.returncode == 1:
                assert deposed, f"seed {seed}: a violation other than the one looked for\n{run.stdout[-3000:]}"
                found[seed] = deposed[0]
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old / "mysql-kill" / "tree")],
            capture_output=True,
            check=False,
        )
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True, check=False)
    assert found, f"none of the CI seeds {SEEDS['mysql']} found the KILL of a recycled connection id"
    print(f"seeds {sorted(found)} of {SEEDS['mysql']} found it; seed {min(found)}: {found[min(found)]}")
