"""What users and the suites rely on whatever the module layout: public names, the wheel, pickles, the old-library
runs of the adversary; and the strict overlap rule of the fault suites.

Each test states one property that must hold; a failure is a finding, not a flaky server.
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import aioelect
from soak.checker import NS, Term, overlaps

from .faults import judge_terms
from .test_wheel import ROOT, build_wheel


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("aioelect.backends.sql.mysql", "MySQLOptions"),
        ("aioelect.backends.sql.postgres", "PostgresOptions"),
        ("aioelect.backends.etcd", "EtcdOptions"),
        ("aioelect.backends.redis", "RedisOptions"),
        ("aioelect.backends.file", "FileOptions"),
        ("aioelect.backends.local", "LocalOptions"),
    ],
)
def test_each_electors_options_are_importable_from_aioelect(module: str, name: str) -> None:
    """Each elector's options typed dict, which user code imports for ``Unpack[...]``, is a public name of
    ``aioelect`` (docs/concepts.md), the one its backend defines: a module path inside the package may move."""
    assert name in aioelect.__all__
    assert getattr(aioelect, name) is getattr(importlib.import_module(module), name)


def test_every_public_name_resolves() -> None:
    """Every name of ``aioelect.__all__`` resolves, the lazy ones through their new homes included."""
    missing = [name for name in aioelect.__all__ if getattr(aioelect, name, None) is None]
    assert missing == []


def test_the_wheel_ships_every_module_of_the_layers(tmp_path: Path) -> None:
    """Every .py file under aioelect/ (core/, wiring/, backends/sql/ among them) is in the wheel."""
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    sources = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "aioelect").rglob("*.py") if "__pycache__" not in p.parts
    }
    assert {"aioelect/core/__init__.py", "aioelect/wiring/__init__.py", "aioelect/backends/sql/__init__.py"} <= sources
    assert sorted(sources - shipped) == []


def test_strict_overlap_counts_one_act_at_the_instant_another_term_starts() -> None:
    """A one-act leadership at the very instant another candidate's term starts, the other acting on for 10 s
    under an older token, is a split brain: strict judging flags it as it flags the same act 1 ns later."""
    later = [Term("a", 1, 0, 10 * NS, 20), Term("b", 2, 1, 1, 1)]
    found_later, _ = overlaps(sorted(later, key=lambda t: (t.start, t.who)), [], 0, strict=True)
    assert found_later, "the control case (one act 1 ns after a's start) must be flagged"
    same = [Term("a", 1, 0, 10 * NS, 20), Term("b", 2, 0, 0, 1)]
    found_same, worst = overlaps(sorted(same, key=lambda t: (t.start, t.who)), [], 0, strict=True)
    assert found_same, f"b's act at a's first instant, a acting 10 s after it, passed (worst overlap {worst} ns)"


def test_judge_terms_fails_a_one_act_term_at_another_terms_start() -> None:
    """The fault suites' judge (judge_terms) fails the same history: a acted for 10 s after b's grant."""
    with pytest.raises(AssertionError, match="split brain"):
        judge_terms([Term("a", 1, 0, 10 * NS, 20), Term("b", 2, 0, 0, 1)])


@pytest.mark.parametrize(
    "error",
    [
        aioelect.BackendUnavailable("lost it"),
        aioelect.PermanentBackendError("no such user"),
        aioelect.UsageError("twice"),
        aioelect.ElectorClosed("closed"),
        aioelect.LeadershipLost("renew deadline passed", aioelect.LossKind.SELF_FENCED),
        aioelect.LeadershipLost("released"),
    ],
    ids=repr,
)
def test_an_exception_pickles_under_its_public_name_and_loads_whole(error: aioelect.ElectionError) -> None:
    """A pickled aioelect exception (multiprocessing, a task queue's stored results) names the module users import,
    ``aioelect``, not where it is defined, so that another release loads it; and it loads whole."""
    data = pickle.dumps(error, protocol=2)
    assert b"caioelect\n" in data and b"aioelect.core" not in data
    loaded = pickle.loads(data)
    assert type(loaded) is type(error) and str(loaded) == str(error)
    if isinstance(error, aioelect.LeadershipLost):
        assert isinstance(loaded, aioelect.LeadershipLost)
        assert (loaded.reason, loaded.kind) == (error.reason, error.kind)


def test_soak_timing_under_an_old_library_imports_only_that_library(tmp_path: Path) -> None:
    """scripts/adversary-old.sh puts an old tree's aioelect first on the path and promises that only that tree's
    package is imported: soak.timing must take ``confirmation_gap`` from the old layout's ``aioelect._config``,
    never load this checkout's ``aioelect/core/`` into the old package (the venv's editable install finds it)."""
    old = tmp_path / "path" / "aioelect"
    old.mkdir(parents=True)
    (old / "__init__.py").write_text('"""An aioelect of the old layout: its core at the root."""\n')
    (old / "_config.py").write_text(
        "def confirmation_gap(check_interval: float, check_timeout: float) -> float:\n"
        "    return check_interval + 2 * check_timeout\n"
    )
    run = tmp_path / "run"
    run.mkdir()
    probe = (
        "import sys, soak.timing\n"
        "print(soak.timing.confirmation_gap.__module__)\n"
        "print(sorted(n + '=' + str(getattr(m, '__file__', '')) for n, m in sys.modules.items() "
        "if n == 'aioelect' or n.startswith('aioelect.')))\n"
    )
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": f"{tmp_path / 'path'}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=run, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    module, loaded = done.stdout.splitlines()
    assert str(ROOT / "aioelect") not in loaded, f"this checkout's modules loaded into the old aioelect: {loaded}"
    assert module == "aioelect._config"
