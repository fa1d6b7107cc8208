"""The interpreter matrix: ``nox -s matrix`` runs the suite that needs no server on every supported Python.

Sessions:

- ``matrix-3.10`` ... ``matrix-3.13``: a fresh environment per interpreter with the package, its
  drivers and its test dependencies, then the tests that need no server (:data:`NO_SERVER`): the
  contract suite on the backends that need none, the elector core, the file backend, command-line
  parsing, the version-specific asyncio tests, the model-based test of the API, and the soak's
  checker on constructed histories.
- ``tests``: the whole suite, servers included, on the interpreter running nox and in its
  environment (``make pytest`` runs the same command in ``.venv``).
- ``lowest`` and ``newest``: the package with the **lowest** releases its ranges in pyproject.toml allow
  (on the oldest Python) and with the **newest** (on the newest Python), unlocked, then ``mypy --strict``
  and :data:`DEPENDENCY_TESTS`: a range that lies fails there.

The matrix installs exactly the lock file (``requirements/dev.txt``), as ``make venv`` does.

An interpreter that cannot be found is skipped, except with ``--error-on-missing-interpreters``
(``make test`` passes it when ``CI`` is set), where it fails the run. Interpreters installed with
pyenv are found without activating them.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nox

#: Every Python the package claims (pyproject's classifiers and README name the same list).
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]

#: The tests that need no server, by file; ``None`` takes the whole file, otherwise a ``-k`` filter
#: (contract test ids name their backend: ``test_x[file]``).
NO_SERVER: dict[str, str | None] = {
    "tests/test_contract.py": "local or file or memory",
    "tests/test_elector.py": None,
    "tests/test_layering.py": None,
    "tests/test_file.py": None,
    "tests/test_cli.py": "bad_usage or help or console_script",
    "tests/test_asyncio_versions.py": None,
    "tests/test_testing.py": None,
    "tests/test_settings.py": None,
    "tests/test_portable_options.py": None,
    "tests/test_leader_only.py": None,
    "tests/test_model.py": None,
    "tests/test_soak.py": "not short_soak",
    "tests/test_register.py": None,
    "tests/test_fenced_state.py": "memory or file or without_fenced_state",
}

#: What ``lowest`` and ``newest`` run besides the tests that need no server: every suite that drives a driver
#: (aiomysql, asyncpg, aetcd with grpcio and protobuf, redis-py, prometheus-client) against its real server.
DEPENDENCY_TESTS = [
    "tests/test_contract.py",
    "tests/test_mysql.py",
    "tests/test_postgres.py",
    "tests/test_etcd.py",
    "tests/test_redis.py",
    "tests/test_redis_sentinel.py",
    "tests/test_redis_cluster.py",
    "tests/test_redis_errors.py",
    "tests/test_sql_shared.py",
    "tests/test_fenced_state.py",
    "tests/test_fence_sql.py",
    "tests/test_cli.py",
]

LOCK = "requirements/dev.txt"

nox.options.sessions = ["matrix", "tests"]
nox.options.default_venv_backend = "uv|virtualenv"
# A missing interpreter is reported (skipped, or an error in CI), never fetched from the network.
nox.options.download_python = "never"

_PATH = os.environ.get("PATH", "")


def _pyenv_bin_dirs() -> list[str]:
    """The ``bin`` folder of the newest pyenv-installed patch release of each of :data:`PYTHONS`.

    pyenv's shims run only the versions selected with ``pyenv global``/``local``; the folders
    themselves hold a working ``pythonX.Y`` whatever is selected.
    """
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found: list[str] = []
    for minor in PYTHONS:
        releases = [
            (int(path.name.rsplit(".", 1)[1]), path / "bin")
            for path in root.glob(f"{minor}.*")
            if re.fullmatch(rf"{re.escape(minor)}\.\d+", path.name) and (path / "bin" / f"python{minor}").exists()
        ]
        if releases:
            found.append(str(max(releases)[1]))
    return found


# Ahead of pyenv's shims, which would be found first and then refuse to run an unselected version.
os.environ["PATH"] = os.pathsep.join([*_pyenv_bin_dirs(), _PATH])


def selection_args(tests: dict[str, str | None]) -> list[str]:
    """pytest's arguments for ``tests``: each file, whole (None) or only its tests that a ``-k`` filter selects."""
    stem = {path: Path(path).stem for path in tests}
    selected = [stem[path] if only is None else f"({stem[path]} and ({only}))" for path, only in tests.items()]
    return [*tests, "-k", " or ".join(selected)]


def no_server_args() -> list[str]:
    return selection_args(NO_SERVER)


@nox.session(python=PYTHONS)
def matrix(session: nox.Session) -> None:
    """The tests that need no server, on one interpreter."""
    # Exactly the lock's versions; subprocesses import the same aioelect as the tests.
    session.install("-c", LOCK, "-e", ".[all,test]")
    session.run("python", "--version")
    if not session.posargs:
        # A renamed test must not drop a file from the matrix unnoticed.
        collected = session.run(
            "python", "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *no_server_args(), silent=True
        )
        empty = [path for path in NO_SERVER if f"{path}::" not in str(collected)]
        if empty:
            session.error(f"no test selected in {', '.join(empty)}: update NO_SERVER in noxfile.py")
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *no_server_args(), *session.posargs)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The whole suite (servers included) on the interpreter running nox, in its environment."""
    # The caller's PATH: pyenv's folders ahead of it would change which ``python3`` the tests start.
    session.run(sys.executable, "-m", "pytest", *session.posargs, env={"PATH": _PATH})


def _locked(name: str) -> str:
    """``name==version`` as the lock file pins it (the tools that check, not what is being checked)."""
    match = re.search(rf"^{re.escape(name)}==([^ \\]+)", Path(LOCK).read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{name} is not in {LOCK}")
    return f"{name}=={match.group(1)}"


def _ranges(session: nox.Session, resolution: str) -> None:
    """Install the package at one end of its ranges, then type-check it and run :data:`DEPENDENCY_TESTS`."""
    session.install(f"--resolution={resolution}", "-e", ".[all,test,apscheduler,asgi,aiohttp,otel]")
    session.install(_locked("mypy"))
    # The versions this session ran, in its log.
    listing = "import importlib.metadata as m; print(*sorted(f'{d.name}=={d.version}' for d in m.distributions()))"
    session.run("python", "-c", listing)
    session.run("mypy", "--strict", "--no-incremental", "aioelect")
    workers = os.environ.get("PYTEST_WORKERS", "2")
    parallel = ["-n", workers, "--dist", "loadfile"] if workers != "0" else []
    # The matrix's selection (the short soak is the whole suite's), with every driver suite whole.
    tests = selection_args({**NO_SERVER, **dict.fromkeys(DEPENDENCY_TESTS)})
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *parallel, *tests, *session.posargs)


@nox.session(python=PYTHONS[0])
def lowest(session: nox.Session) -> None:
    """The lowest releases pyproject.toml's ranges allow, on the oldest supported Python."""
    _ranges(session, "lowest-direct")


@nox.session(python=PYTHONS[-1])
def newest(session: nox.Session) -> None:
    """The newest releases pyproject.toml's ranges allow, on the newest supported Python."""
    _ranges(session, "highest")
