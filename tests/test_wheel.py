"""What ships: the wheel ``python -m build`` makes holds aioelect/ and its pytest11 entry point, and no test harness.

The build runs offline (``--no-isolation``, the ``build`` and ``setuptools``
of the dev extra) on a copy of the checkout's packaging inputs with
``tests/`` beside the package, as in the checkout. It takes about a second.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Words only server-starting test code has: the harness's servers, proxy, CA and privilege drop.
HARNESS_WORDS = ("mariadb-install-db", "initdb", "TCPProxy", "MariaDBServer", "EtcdCluster", "setuid", "openssl")


def build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("aioelect", "tests"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    dist = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = dist.glob("*.whl")
    return wheel


def test_the_wheel_ships_the_package_and_its_pytest_plugin_but_no_harness(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        sources = {name: archive.read(name).decode() for name in names if name.endswith(".py")}
        entry_points = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))

    outside = [n for n in names if not n.startswith(("aioelect/", "aioelect-"))]
    assert outside == [], f"the wheel ships more than the package: {outside}"
    assert not [n for n in names if "harness" in n or n.startswith("tests/")]
    for name, text in sources.items():
        found = [word for word in HARNESS_WORDS if word in text]
        assert not found, f"{name} in the wheel holds server-starting test code ({found})"

    for module in ("aioelect/testing.py", "aioelect/pytest_plugin.py", "aioelect/backends/memory.py"):
        assert module in names
    assert "class MemoryElector(Elector)" in sources["aioelect/wiring/_electors.py"]
    assert "from .wiring._electors import MemoryElector" in sources["aioelect/testing.py"]
    assert "[pytest11]\naioelect = aioelect.pytest_plugin" in entry_points, entry_points
