"""Finding the executables and packages a server needs, and pinning which etcd runs.

``etcd``, ``etcdctl`` and ``etcdutl`` follow ``AIOELECT_TEST_ETCD_DIR`` and
``AIOELECT_TEST_ETCD_VERSION`` (see :func:`require_binary`): an unmet request
is a :class:`~tests.harness.errors.HarnessError`, never a skip or a fallback
to another etcd.
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable, Sequence

from .errors import HarnessError, MissingBinaryError

__all__ = [
    "ENV_ETCD_DIR",
    "ENV_ETCD_VERSION",
    "etcd_tool_version",
    "etcd_version_matches",
    "expected_etcd_version",
    "require_binary",
    "require_module",
]


def _default_search_dirs() -> list[str]:
    def pg_version(path: str) -> float:
        try:
            return float(os.path.basename(os.path.dirname(path)))
        except ValueError:
            return 0.0

    pg_dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=pg_version, reverse=True)
    return ["/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/local/bin", *pg_dirs]


#: Directory holding the ``etcd`` and ``etcdctl`` (and ``etcdutl``) every etcd test must use.
ENV_ETCD_DIR = "AIOELECT_TEST_ETCD_DIR"
#: ``3.5`` or ``3.5.1``: the version those executables must report, else the harness refuses them.
ENV_ETCD_VERSION = "AIOELECT_TEST_ETCD_VERSION"

_ETCD_TOOLS = frozenset({"etcd", "etcdctl", "etcdutl"})


def require_binary(name: str, *alternatives: str, search_dirs: Iterable[str] = ()) -> str:
    """Return the absolute path of an executable, or raise :class:`MissingBinaryError`.

    ``name`` and then each of ``alternatives`` is looked up in ``search_dirs``,
    then on ``PATH``, then in ``/usr/sbin``, ``/usr/local/sbin``, ``/sbin`` and
    ``/usr/lib/postgresql/*/bin`` (newest version first).

    ``etcd``, ``etcdctl`` and ``etcdutl`` follow two environment variables, so
    that one run tests one etcd version end to end (server and ``etcdctl``):

    * ``AIOELECT_TEST_ETCD_DIR``: they are taken from that directory and from
      nowhere else;
    * ``AIOELECT_TEST_ETCD_VERSION`` (``3.5`` or ``3.5.1``): the executable
      must report that version.

    An unmet request (no such executable in the directory, another version,
    a malformed version) raises :class:`HarnessError`, never a skip or a
    fallback to another etcd.
    """
    if name in _ETCD_TOOLS:
        pinned = os.environ.get(ENV_ETCD_DIR, "").strip()
        if pinned:
            path = os.path.join(os.path.abspath(pinned), name)
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                raise HarnessError(f"{ENV_ETCD_DIR}={pinned!r} has no executable {name!r}")
        else:
            path = _find_binary(name, alternatives, search_dirs)
        _check_etcd_version(name, path)
        return path
    return _find_binary(name, alternatives, search_dirs)


def _find_binary(name: str, alternatives: Sequence[str], search_dirs: Iterable[str]) -> str:
    extra = list(search_dirs)
    for candidate in (name, *alternatives):
        for directory in extra:
            path = os.path.join(directory, candidate)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        found = shutil.which(candidate)
        if found:
            return found
        for directory in _default_search_dirs():
            path = os.path.join(directory, candidate)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    names = " or ".join(repr(n) for n in (name, *alternatives))
    raise MissingBinaryError(f"required executable {names} not found on PATH or in standard locations")


def expected_etcd_version() -> str | None:
    """The etcd version ``AIOELECT_TEST_ETCD_VERSION`` asks for (``3.5`` or ``3.5.1``), or None.

    Raises :class:`HarnessError` when the value is not such a version.
    """
    raw = os.environ.get(ENV_ETCD_VERSION, "").strip()
    if not raw:
        return None
    if not re.fullmatch(r"\d+\.\d+(?:\.\d+)?", raw):
        raise HarnessError(f"{ENV_ETCD_VERSION}={raw!r} is not a version such as 3.5 or 3.5.1")
    return raw


def etcd_version_matches(version: str, expected: str) -> bool:
    """True if ``version`` (``3.5.1``) is ``expected`` (``3.5`` or ``3.5.1``), compared component by component."""
    want = expected.split(".")
    return re.split(r"[.+-]", version)[: len(want)] == want


_ETCD_VERSION_LINE = re.compile(r"^\s*(?:etcd|etcdctl|etcdutl) version:\s*v?(\d+\.\d+\.\d+\S*)", re.I | re.M)
_tool_versions: dict[str, str] = {}
_tool_versions_lock = threading.Lock()


def etcd_tool_version(path: str, tool: str | None = None) -> str:
    """The version (``3.5.1``) that the executable ``path`` reports; ``tool`` defaults to its file name.

    Runs ``etcd --version`` or ``etcdctl version`` / ``etcdutl version``
    once per path (cached), bounded to 20 s; raises :class:`HarnessError` when
    it fails or prints no version.
    """
    with _tool_versions_lock:
        cached = _tool_versions.get(path)
    if cached is not None:
        return cached
    tool = tool or os.path.basename(path)
    argv = [path, "--version"] if tool == "etcd" else [path, "version"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=20.0, env=dict(os.environ, ETCDCTL_API="3"), check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessError(f"could not run {' '.join(argv)}: {exc}") from exc
    match = _ETCD_VERSION_LINE.search(done.stdout)
    if done.returncode != 0 or match is None:
        output = (done.stdout + done.stderr).strip()[-500:]
        raise HarnessError(f"{' '.join(argv)} reported no version (exit status {done.returncode}): {output!r}")
    version = match.group(1)
    with _tool_versions_lock:
        _tool_versions[path] = version
    return version


def _check_etcd_version(tool: str, path: str) -> None:
    expected = expected_etcd_version()
    if expected is None:
        return
    version = etcd_tool_version(path, tool)
    if not etcd_version_matches(version, expected):
        raise HarnessError(f"{ENV_ETCD_VERSION}={expected} but {path} is {tool} {version}")


def require_module(module: str, who: str) -> None:
    """Raise :class:`MissingBinaryError` unless the Python package ``module`` can be imported."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise MissingBinaryError(f"{who} needs the {module!r} package") from exc
