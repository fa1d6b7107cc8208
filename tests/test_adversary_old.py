"""The adversary's CI seeds find the bug a fix removed, when run on the library as it was before that fix.

``scripts/adversary-old.sh`` checks the commit before the fix out in a
worktree of its own, with only the interceptor seam the adversary plugs into
(``soak/adversary/old/``), and runs today's adversary against it. A seed that
finds a violation exits with status 1 and names it; one that finds nothing
exits with 0. The bugs (docs/adversary.md, "Shown to find"):

* ``mysql-kill``: a lock session kept across a MariaDB restart KILLed, by
  its old connection id, the session the restarted server had given that id,
  a healthy leader's (*deposed*);
* ``etcd-late-read``: a waiter's late read of the leader replaced a newer
  view, and the waiter led beside the real leader (*overlap*);
* ``redis-split``: a Redis master cut off from its sentinels (the
  candidates still reaching it) confirmed the old leader's renews while the
  replica the sentinels promoted elected another leader (*overlap*);
* ``stopped-shim``: a CMD that stopped its shim (``kill -STOP $PPID``) kept
  its setsid worker running after ``aioelect run`` let the lock go, beside
  the next leader's CMD (*overlap*, ``--stops``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from soak.adversary.servers import SERVERS
from tests.harness.plugin import skip_if_external

from .test_adversary import SECONDS, SEEDS, STOP_SEEDS

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "adversary-old.sh"

#: Per old library: the fix's commit (the script checks out its parent), its backend, the seeds to run in turn
#: until one finds the bug, and the violation it makes. MySQL's CI seeds (3, 8, 18) found it on most runs, but a
#: loaded CI machine once ran all three without the interleaving: they run twice over. Of etcd's CI seeds
#: (1, 16, 18), seed 16 found it in 7 runs of 10 and the others seldom: seed 16 runs up to four times, then the
#: other two.
OLD = {
    "mysql-kill": ("79d808b", "mysql", [*SEEDS["mysql"], *SEEDS["mysql"]], "deposed:"),
    "etcd-late-read": ("12e8962", "etcd", [16, 16, 16, 16, 18, 1], "overlap:"),
    "redis-split": ("e8940ad", "redis-sentinel", [7, 1, 7, 1], "overlap:"),
    "stopped-shim": ("f73605d", "etcd", [*STOP_SEEDS["etcd"], *STOP_SEEDS["etcd"]], "overlap:"),
}
#: The adversary's mode per old library ("": the electors in one process), the seeds it draws from, and the other
#: violations a run may also report there: an old supervisor whose shim its CMD stopped waits on it past SIGTERM.
MODES = {"stopped-shim": ("--stops", STOP_SEEDS, ("leftover:",))}


def _in_history(commit: str) -> bool:
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^^{{commit}}"], capture_output=True)
    return found.returncode == 0


#: Under the locked dependency versions (grpcio 1.85.3, anyio 4.16, redis 8.2) the etcd seeds seldom meet the
#: late-read interleaving on the old library (this test found it in 1 of 2 runs, seed 16 alone in 0 of 3): the
#: case still runs, and reports XPASS when a seed finds it, until seeds are searched again.
_NO_LONGER_FOUND = {"etcd-late-read"}


@pytest.mark.timeout(500)
@pytest.mark.parametrize(
    "old",
    [
        pytest.param(name, marks=pytest.mark.xfail(reason="seeds to be searched again", strict=False))
        if name in _NO_LONGER_FOUND
        else name
        for name in sorted(OLD)
    ],
)
def test_ci_seeds_find_the_bug_on_the_library_before_its_fix(old: str, tmp_path: Path) -> None:
    commit, backend, seeds, violation = OLD[old]
    mode, ci_seeds, also = MODES.get(old, ("", SEEDS, ()))
    assert set(seeds) <= set(ci_seeds[backend]), "only CI seeds count"
    skip_if_external(SERVERS[backend].backend)
    if not _in_history(commit):
        pytest.skip(f"this checkout lacks {commit}^ (a shallow clone?): scripts/adversary-old.sh needs the history")
    where = tmp_path / "old"
    # TMPDIR: the stops workload keeps the heartbeats and logs of a run that found something there.
    env = {**os.environ, "ADVERSARY_OLD": str(where), "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    found = None
    runs: list[str] = []  # per run: its seed, status and headline, or why it broke
    try:
        for seed in seeds:
            argv = ["bash", str(SCRIPT), old, "--backend", backend, *([mode] if mode else []), "--seed", str(seed)]
            argv += ["--seeds", "1"]
            run = subprocess.run(
                [*argv, "--seconds", str(SECONDS)], env=env, capture_output=True, text=True, timeout=120, check=False
            )
            # 0: nothing found; 1: a violation, or Python's status for an exception (then no violation is named).
            assert run.returncode in (0, 1), f"seed {seed}: exit {run.returncode}\n{run.stderr[-3000:]}"
            found_lines = [line.strip() for line in run.stdout.splitlines() if re.match(r"  [a-z-]+: ", line)]
            head = run.stdout.splitlines()[0] if run.stdout.strip() else "(no output)"
            # Exit 1 naming no violation is Python's status for an exception: the run broke (a server that did not
            # start, an import the old library lacks), which must not pass for "found nothing".
            broke = run.stderr[run.stderr.rfind("Traceback") :] if "Traceback" in run.stderr else run.stderr
            assert run.returncode == 0 or found_lines, f"seed {seed}: exit 1 naming no violation\n{broke[-3000:]}"
            runs.append(f"seed {seed}: exit {run.returncode}: {head}")
            if run.returncode == 1:
                lines = [line for line in found_lines if line.startswith(violation)]
                others = [line for line in found_lines if not line.startswith((violation, *also))]
                assert lines or not others, f"seed {seed}: a violation other than {violation!r}\n{run.stdout[-3000:]}"
                if not lines:
                    continue
                found = f"seed {seed}, run {len(runs)}: {lines[0]}"
                break
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where / old / "tree")],
            capture_output=True,
            check=False,
        )
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True, check=False)
    summary = "\n".join(runs)
    assert found is not None, (
        f"{len(runs)} runs of the CI seeds {seeds} found nothing on the library before the fix:\n{summary}"
    )
    print(f"{old}: {found}")
