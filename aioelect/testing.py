"""Real-server test harness for aioelect.

This module starts *real*, throwaway servers on loopback addresses so that
tests (aioelect's own, or a user's) can exercise leader election against the
actual software it runs on, and inject faults into it:

* :class:`MariaDBServer` -- a private ``mariadbd`` with a temporary data dir.
* :class:`EtcdServer` -- a private single-member ``etcd`` (v3 API only).
* :class:`EtcdCluster` -- three (or more) ``etcd`` members on loopback.
* :class:`PostgresServer` -- a private ``postgres`` cluster (``initdb``).
* :class:`TCPProxy` -- a fault-injecting TCP proxy (pass / stall / drop).

Every server supports the same lifecycle: ``start()``, ``stop()``,
``kill()`` (SIGKILL), ``freeze()`` (SIGSTOP), ``thaw()`` (SIGCONT),
``restart()`` (same ports, same data), ``cleanup()`` (stop and delete the data
dir) and the context-manager protocol.

Guarantees
----------
* Everything listens on ``127.0.0.1`` only.
* Every wait is bounded in time; a failed start raises
  :class:`ServerStartError` whose message includes the tail of the server log.
* Spawned processes die with the test process, even when it is SIGKILLed:
  each child gets ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (Linux) and is forked
  from one long-lived harness thread (the parent-death signal fires when the
  *forking thread* exits, so forking from short-lived worker threads, e.g.
  ``asyncio.to_thread``, would otherwise kill servers early).  Servers still
  alive at interpreter exit are cleaned up by an ``atexit`` hook.  A SIGKILLed
  test process cannot remove its temporary directories
  (``/tmp/aioelect-*``); the processes still die.
* Only the standard library is imported at import time.  ``pymysql`` (MariaDB
  helpers) and ``asyncpg`` (PostgreSQL helpers) are imported when needed.

Pytest plugin
-------------
The bottom section defines pytest fixtures.  They are defined only when
pytest is already imported (always the case inside a pytest run), so importing
this module outside pytest does not import pytest.  Use either
``pytest_plugins = ["aioelect.testing"]`` or
``from aioelect.testing import *  # noqa`` in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import errno
import glob
import importlib
import json
import logging
import os
import pwd
import queue
import re
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

__all__ = [
    "HarnessError",
    "MissingBinaryError",
    "ServerStartError",
    "free_port",
    "require_binary",
    "ENV_ETCD_DIR",
    "ENV_ETCD_VERSION",
    "expected_etcd_version",
    "etcd_tool_version",
    "MariaDBServer",
    "EtcdServer",
    "EtcdCluster",
    "PostgresServer",
    "TCPProxy",
]

_T = TypeVar("_T")
_S = TypeVar("_S", bound="_Started")

LOOPBACK = "127.0.0.1"

log = logging.getLogger("aioelect.testing")


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class HarnessError(RuntimeError):
    """Base class of every error raised by the harness."""


class MissingBinaryError(HarnessError):
    """A server binary needed by the harness is not installed."""


class ServerStartError(HarnessError):
    """A server did not become ready in time (message includes its log tail)."""


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------

_issued_ports: set[int] = set()
_issued_ports_lock = threading.Lock()


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now.

    The port is chosen by the kernel (bind to port 0) and is never handed out
    twice by the same process.  Another process may still grab it before the
    caller binds it; servers started by this harness retry once with fresh
    ports when their first start fails with "address in use".
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            port = int(sock.getsockname()[1])
        with _issued_ports_lock:
            if port not in _issued_ports:
                _issued_ports.add(port)
                return port
    raise HarnessError("could not find a free TCP port on 127.0.0.1")


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


def _wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05, what: str = "condition") -> None:
    """Poll ``predicate`` until it is true; raise TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


# --- child-process plumbing -------------------------------------------------

def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


_prctl = _load_prctl()


# The first program every harness child runs, in a fresh interpreter: it imports what it needs
# while it may still read the interpreter's files (another user may not), drops privileges, arms
# the parent-death signal (after the credential change, which clears it), makes sure the test
# process still exists, and execs the real program under the same pid.
_CHILD_SHIM = """\
import ctypes, os, sys
parent, sig, uid, gid, argv = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
if uid >= 0:
    os.setgroups([gid])
    os.setgid(gid)
    os.setuid(uid)
if sig:
    if ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        sys.exit("aioelect harness: prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)
os.execvp(argv[0], argv)
"""


def _child_argv(argv: Sequence[str], run_as: pwd.struct_passwd | None) -> list[str]:
    """``argv`` behind :data:`_CHILD_SHIM`.

    Children are started without a ``preexec_fn``, so CPython starts them
    with ``vfork`` and no ``fork`` handler of any library loaded in the test
    process runs in them: grpcio's (from 1.80, grpc/grpc#43055) can abort a
    forked child before ``exec`` while gRPC channels are busy.
    """
    if not sys.executable:
        raise HarnessError("cannot start a child process: the path of the Python interpreter is unknown")
    sig = int(signal.SIGKILL) if _prctl is not None else 0
    uid, gid = (run_as.pw_uid, run_as.pw_gid) if run_as is not None else (-1, -1)
    return [sys.executable, "-I", "-S", "-c", _CHILD_SHIM, str(os.getpid()), str(sig), str(uid), str(gid), *argv]


class _Spawner:
    """Forks every harness child from one long-lived daemon thread.

    ``PR_SET_PDEATHSIG`` fires when the thread that forked the child exits,
    not when the process exits.  Forking from a dedicated thread that lives
    as long as the process makes "the child dies with the test process" hold
    whatever thread (or event loop executor) asked for the server.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while True:
            func, fut = self._queue.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(func())
            except BaseException as exc:
                fut.set_exception(exc)

    def call(self, func: Callable[[], _T], timeout: float = 30.0) -> _T:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="aioelect-spawner", daemon=True)
                self._thread.start()
        fut: Future[_T] = Future()
        self._queue.put((func, fut))
        return fut.result(timeout=timeout)


_spawner = _Spawner()


def _popen(
    argv: Sequence[str],
    *,
    log_path: str,
    run_as: pwd.struct_passwd | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session, output appended to ``log_path``.

    The child runs as ``run_as`` (if given), dies with the test process
    (``PR_SET_PDEATHSIG``, Linux) and keeps the pid returned here.  A program
    that cannot be found raises :class:`FileNotFoundError` here.
    """
    program = argv[0]
    if os.sep not in program:
        found = shutil.which(program, path=(os.environ if env is None else env).get("PATH", os.defpath))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)
        program = found
    child_argv = _child_argv([program, *argv[1:]], run_as)

    def spawn() -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                child_argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=cwd,
                close_fds=True,
            )

    return _spawner.call(spawn)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid`` from /proc, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2 :].split()
    if len(rest) < 2:
        return None
    return rest[0], int(rest[1])


def _pid_alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    if stat is None:
        if not os.path.isdir("/proc"):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return False
    return stat[0] not in ("Z", "X")


def _descendants(root: int) -> list[int]:
    """All live descendants of ``root`` (breadth-first), via /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        stat = _proc_stat(int(entry))
        if stat is not None and stat[0] not in ("Z", "X"):
            children.setdefault(stat[1], []).append(int(entry))
    result: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop(0)
        for child in children.get(pid, []):
            result.append(child)
            todo.append(child)
    return result


def _signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _signal_tree(root: int, sig: int) -> list[int]:
    """Send ``sig`` to ``root`` first, then to all of its descendants.

    Returns the descendants signalled.  For SIGKILL the root is SIGSTOPped
    first so it cannot fork while its tree is being collected.
    """
    if sig == signal.SIGKILL:
        _signal_pid(root, signal.SIGSTOP)
        kids = _descendants(root)
        for pid in kids:
            _signal_pid(pid, signal.SIGSTOP)
        kids = _descendants(root) or kids
        _signal_pid(root, signal.SIGKILL)
        for pid in kids:
            _signal_pid(pid, signal.SIGKILL)
        return kids
    _signal_pid(root, sig)
    kids = _descendants(root)
    for pid in kids:
        _signal_pid(pid, sig)
    return kids


def _tail(path: str, max_bytes: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<could not read {path}: {exc}>"


_ADDRESS_IN_USE = re.compile(r"address already in use|could not bind|could not create listen socket", re.I)


# --- cleanup registry -------------------------------------------------------

_live_lock = threading.Lock()
_live: dict[int, Any] = {}


def _register(obj: Any) -> None:
    with _live_lock:
        _live[id(obj)] = obj


def _unregister(obj: Any) -> None:
    with _live_lock:
        _live.pop(id(obj), None)


@atexit.register
def _cleanup_everything() -> None:
    """atexit hook: clean up every server and proxy that is still alive."""
    with _live_lock:
        objs = list(_live.values())
    for obj in objs:
        with contextlib.suppress(Exception):
            if isinstance(obj, TCPProxy):
                obj.close()
            else:
                obj.cleanup()


def _run_coroutine(factory: Callable[[], Coroutine[Any, Any, _T]], timeout: float) -> _T:
    """Run a coroutine in a fresh event loop on a fresh thread, bounded in time.

    Works whether or not the calling thread already runs an event loop.
    """
    result: list[_T] = []
    error: list[BaseException] = []

    def runner() -> None:
        try:
            result.append(asyncio.run(asyncio.wait_for(factory(), timeout)))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=runner, name="aioelect-harness-query", daemon=True)
    thread.start()
    thread.join(timeout + 5.0)
    if thread.is_alive():
        raise TimeoutError(f"operation did not finish within {timeout + 5.0:.1f}s")
    if error:
        exc = error[0]
        if isinstance(exc, asyncio.TimeoutError):
            raise TimeoutError(f"operation timed out after {timeout:.1f}s") from exc
        raise exc
    return result[0]


# ---------------------------------------------------------------------------
# Server lifecycle base class
# ---------------------------------------------------------------------------


class _Started:
    """Started by ``with``, and always cleaned up, even when the start fails."""

    def start(self) -> None:
        raise NotImplementedError

    def cleanup(self) -> None:
        raise NotImplementedError

    def __enter__(self: _S) -> _S:
        try:
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


class _ManagedServer(_Started):
    """Lifecycle shared by all servers (one root process, maybe children).

    Subclasses implement ``_argv``, ``_probe`` and optionally ``_prepare``,
    ``_after_start`` and ``_reassign_ports``.
    """

    kind: ClassVar[str] = "server"
    stop_signal: ClassVar[int] = signal.SIGTERM

    host = LOOPBACK

    def __init__(
        self, *, extra_args: Sequence[str] = (), startup_timeout: float = 30.0, stop_timeout: float = 15.0
    ) -> None:
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._prepared = False
        self._ever_ready = False
        self._auto_ports = True
        self._frozen = False
        self._cleaned = False
        self._dir = tempfile.mkdtemp(prefix=f"aioelect-{self.kind}-")
        self.log_path = os.path.join(self._dir, "server.log")
        self.data_dir = os.path.join(self._dir, "data")
        _register(self)

    # -- hooks ---------------------------------------------------------------

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _probe(self) -> bool:
        """Return True once the server answers a real request."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """One-time initialisation of the data directory."""

    def _after_start(self) -> None:
        """Run once per successful start, after the server is ready."""

    def _reassign_ports(self) -> bool:
        """Pick new ports after an "address in use" failure; False if impossible."""
        return False

    def _run_as(self) -> pwd.struct_passwd | None:
        return None

    # -- properties ----------------------------------------------------------

    @property
    def directory(self) -> str:
        """Temporary directory owned by this server (data, socket, log)."""
        return self._dir

    @property
    def pid(self) -> int:
        """PID of the most recently started server process."""
        if self._proc is None:
            raise HarnessError(f"{self.kind} server was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the server process exists (also when frozen)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def frozen(self) -> bool:
        """True between :meth:`freeze` and :meth:`thaw`."""
        return self._frozen and self.running

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The last ``max_bytes`` of the server log (stdout and stderr)."""
        return _tail(self.log_path, max_bytes)

    # -- lifecycle -----------------------------------------------------------

    def _spawn(self) -> None:
        if self._cleaned:
            raise HarnessError(f"{self.kind} server was cleaned up; create a new one")
        if not self._prepared:
            self._prepare()
            self._prepared = True
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== aioelect harness: starting {self.kind} at {time.ctime()} =====\n".encode())
        self._frozen = False
        self._proc = _popen(self._argv(), log_path=self.log_path, run_as=self._run_as(), cwd=self._dir)

    def _wait_ready(self, deadline: float) -> None:
        proc = self._proc
        assert proc is not None
        last_error: BaseException | None = None
        while True:
            if proc.poll() is not None:
                raise ServerStartError(
                    f"{self.kind} server exited with status {proc.returncode} during startup; "
                    f"log tail ({self.log_path}):\n{self.log_tail()}"
                )
            try:
                if self._probe():
                    return
            except Exception as exc:
                last_error = exc
            if time.monotonic() >= deadline:
                self._kill_process()
                raise ServerStartError(
                    f"{self.kind} server not ready after {self.startup_timeout:.1f}s "
                    f"(last probe error: {last_error!r}); log tail ({self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _start_once(self) -> None:
        self._spawn()
        self._wait_ready(time.monotonic() + self.startup_timeout)

    def start(self) -> None:
        """Start the server and block until it answers a real request.

        No-op if already running.  Bounded by ``startup_timeout``; on failure
        the process is killed and :class:`ServerStartError` (with the log
        tail) is raised.  After :meth:`kill` or :meth:`stop` it restarts on
        the same ports with the same data.
        """
        with self._lock:
            if self.running:
                return
            try:
                self._start_once()
            except ServerStartError as exc:
                in_use = _ADDRESS_IN_USE.search(str(exc)) is not None
                if not (in_use and not self._ever_ready and self._auto_ports and self._reassign_ports()):
                    raise
                self._start_once()
            self._ever_ready = True
            self._after_start()

    def _wait_gone(self, pids: Iterable[int], timeout: float) -> None:
        pending = list(pids)
        with contextlib.suppress(TimeoutError):
            _wait_until(lambda: not any(_pid_alive(p) for p in pending), timeout, 0.02, "children to exit")

    def _kill_process(self) -> None:
        proc = self._proc
        if proc is None:
            return
        kids = _signal_tree(proc.pid, signal.SIGKILL) if proc.poll() is None else []
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10.0)
        self._wait_gone(kids, 10.0)
        self._frozen = False

    def stop(self, timeout: float | None = None) -> None:
        """Shut the server down gracefully; SIGKILL it after ``timeout`` s.

        Works on a frozen server too (it is thawed first).  Returns once the
        server process and its children have exited.  No-op if not running.
        """
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                self._frozen = False
                return
            wait = self.stop_timeout if timeout is None else timeout
            kids = _descendants(proc.pid)
            _signal_pid(proc.pid, self.stop_signal)
            _signal_tree(proc.pid, signal.SIGCONT)
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                self._kill_process()
            self._wait_gone(kids, 5.0)
            self._frozen = False

    def kill(self) -> None:
        """SIGKILL the server and all of its children (a crash); wait until gone."""
        with self._lock:
            self._kill_process()

    def freeze(self) -> None:
        """SIGSTOP the server and its children: connections stay open, nothing answers."""
        with self._lock:
            if not self.running:
                raise HarnessError(f"{self.kind} server is not running")
            assert self._proc is not None
            _signal_tree(self._proc.pid, signal.SIGSTOP)
            self._frozen = True

    def thaw(self) -> None:
        """SIGCONT the server and its children (undo :meth:`freeze`)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                _signal_tree(self._proc.pid, signal.SIGCONT)
            self._frozen = False

    def restart(self) -> None:
        """Graceful :meth:`stop` then :meth:`start`, same ports and data dir."""
        with self._lock:
            self.stop()
            self.start()

    def cleanup(self) -> None:
        """Stop the server (killing it if needed) and delete its directory. Idempotent."""
        with self._lock:
            if self._cleaned:
                return
            try:
                self.stop(timeout=min(self.stop_timeout, 10.0))
            finally:
                self._kill_process()
                self._cleaned = True
                shutil.rmtree(self._dir, ignore_errors=True)
                _unregister(self)

    def __repr__(self) -> str:
        state = "frozen" if self.frozen else "running" if self.running else "stopped"
        return f"<{type(self).__name__} {state} dir={self._dir!r}>"


def _run_bounded(
    argv: Sequence[str],
    *,
    log_path: str,
    timeout: float,
    what: str,
    run_as: pwd.struct_passwd | None = None,
    cwd: str | None = None,
) -> None:
    """Run a one-shot helper (e.g. ``initdb``), bounded; raise with log tail on failure."""
    with open(log_path, "ab") as log:
        log.write(f"\n===== aioelect harness: {' '.join(argv)} =====\n".encode())
    proc = _popen(argv, log_path=log_path, run_as=run_as, cwd=cwd)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_tree(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10.0)
        raise ServerStartError(f"{what} did not finish in {timeout:.0f}s; log tail:\n{_tail(log_path)}") from None
    if rc != 0:
        raise ServerStartError(f"{what} failed with status {rc}; log tail:\n{_tail(log_path)}")


# ---------------------------------------------------------------------------
# MariaDB
# ---------------------------------------------------------------------------


def _quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _require_module(module: str, who: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise MissingBinaryError(f"{who} needs the {module!r} package") from exc


class _OnePortServer(_ManagedServer):
    """A server with one client port on 127.0.0.1; a free one is picked unless ``port`` is given."""

    def __init__(
        self,
        *,
        port: int | None,
        extra_args: Sequence[str],
        startup_timeout: float,
        stop_timeout: float,
    ) -> None:
        super().__init__(extra_args=extra_args, startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self._auto_ports = port is None
        self._port = port if port is not None else free_port()

    @property
    def port(self) -> int:
        """TCP port (stable across restarts)."""
        return self._port

    def _reassign_ports(self) -> bool:
        self._port = free_port()
        return True


class MariaDBServer(_OnePortServer):
    """A throwaway MariaDB server on 127.0.0.1 with its own data directory.

    ``root`` has an empty password; the database ``database`` (default
    ``aioelect_test``) exists after every start.  Durability is relaxed for
    speed but survives a process crash (``kill()``): committed transactions
    are written to the OS on commit (``innodb_flush_log_at_trx_commit=2``).
    """

    kind = "mariadb"

    def __init__(
        self,
        *,
        port: int | None = None,
        database: str = "aioelect_test",
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        _require_module("pymysql", "MariaDBServer")  # start() and query() use it
        self._mariadbd = require_binary("mariadbd", "mysqld")
        self._install_db = require_binary("mariadb-install-db", "mysql_install_db")
        super().__init__(port=port, extra_args=extra_args, startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.database = database
        self.socket_path = os.path.join(self._dir, "mysql.sock")

    @property
    def dsn(self) -> str:
        """``mysql://root@127.0.0.1:PORT/<database>``."""
        return f"mysql://root@{self.host}:{self._port}/{self.database}"

    def _common_args(self) -> list[str]:
        args = [
            "--innodb-buffer-pool-size=16M",
            "--innodb-log-file-size=8M",
        ]
        if os.geteuid() == 0:
            args.append("--user=root")
        return args

    def _prepare(self) -> None:
        _run_bounded(
            [
                self._install_db,
                "--no-defaults",
                f"--datadir={self.data_dir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                *self._common_args(),
            ],
            log_path=self.log_path,
            timeout=120.0,
            what="mariadb-install-db",
            cwd=self._dir,
        )

    def _argv(self) -> list[str]:
        return [
            self._mariadbd,
            "--no-defaults",
            f"--datadir={self.data_dir}",
            f"--port={self._port}",
            f"--bind-address={LOOPBACK}",
            f"--socket={self.socket_path}",
            f"--pid-file={os.path.join(self._dir, 'mariadbd.pid')}",
            *self._common_args(),
            "--skip-name-resolve",
            "--skip-log-bin",
            "--innodb-flush-log-at-trx-commit=2",
            "--innodb-doublewrite=0",
            "--max-connections=500",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
            *self.extra_args,
        ]

    def _connect(self, *, database: str | None, timeout: float, user: str = "root", password: str = "") -> Any:
        import pymysql

        return pymysql.connect(
            host=self.host,
            port=self._port,
            user=user,
            password=password,
            database=database,
            connect_timeout=timeout,
            read_timeout=timeout,
            write_timeout=timeout,
            autocommit=True,
        )

    def _probe(self) -> bool:
        conn = self._connect(database=None, timeout=2.0)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
                return bool(cur.fetchone() == (1,))
        finally:
            conn.close()

    def _after_start(self) -> None:
        self.query(f"CREATE DATABASE IF NOT EXISTS {_quote_ident(self.database)}", database="")

    def query(
        self,
        sql: str,
        args: Sequence[Any] | dict[str, Any] | None = None,
        *,
        database: str | None = None,
        timeout: float = 5.0,
    ) -> list[tuple[Any, ...]]:
        """Run one statement as root on a new short-lived connection (autocommit).

        ``args`` uses pymysql's ``%s`` / ``%(name)s`` placeholders.  Returns
        all rows (``[]`` for statements without a result set).  Connect, read
        and write are each bounded by ``timeout`` seconds, so this raises
        (``pymysql.err.OperationalError``) instead of hanging on a frozen
        server.  ``database=""`` connects without selecting a database.
        Blocking: do not call it from a latency-sensitive event loop.
        """
        db = self.database if database is None else (database or None)
        conn = self._connect(database=db, timeout=timeout)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                rows = cur.fetchall() if cur.description else ()
                return [tuple(row) for row in rows]
        finally:
            conn.close()

    def connection_ids(self, user: str | None = None) -> list[int]:
        """IDs of client connections (excluding the one used to ask), optionally of one user."""
        sql = (
            "SELECT ID FROM information_schema.PROCESSLIST "
            "WHERE ID <> CONNECTION_ID() AND COMMAND <> 'Daemon' AND USER <> 'system user'"
        )
        if user is None:
            rows = self.query(sql, database="")
        else:
            rows = self.query(sql + " AND USER = %s", (user,), database="")
        return [int(row[0]) for row in rows]

    def kill_connections(self, user: str | None = None) -> int:
        """``KILL`` every client connection (optionally of one user); return how many."""
        killed = 0
        for conn_id in self.connection_ids(user):
            try:
                self.query(f"KILL {int(conn_id)}", database="")
                killed += 1
            except Exception as exc:
                if "Unknown thread id" not in str(exc):
                    raise
        return killed

    def create_user(self, user: str, password: str, database: str | None = None) -> str:
        """Create (or reset) ``user``@'%' with ``password`` and all privileges on ``database``.

        ``database`` defaults to :attr:`database` and is created if missing.
        Returns a DSN ``mysql://user:password@127.0.0.1:PORT/database``.
        """
        db = self.database if database is None else database
        self.query(f"CREATE DATABASE IF NOT EXISTS {_quote_ident(db)}", database="")
        self.query("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (user, password), database="")
        self.query("ALTER USER %s@'%%' IDENTIFIED BY %s", (user, password), database="")
        self.query(f"GRANT ALL PRIVILEGES ON {_quote_ident(db)}.* TO %s@'%%'", (user,), database="")
        quote = urllib.parse.quote
        return f"mysql://{quote(user, safe='')}:{quote(password, safe='')}@{self.host}:{self._port}/{quote(db)}"


# ---------------------------------------------------------------------------
# etcd
# ---------------------------------------------------------------------------


def _http_json(url: str, timeout: float, body: bytes | None = None) -> Any:
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


_started_etcd: dict[str, str] = {}
_started_etcd_lock = threading.Lock()


def started_etcd_versions() -> dict[str, str]:
    """``{path: version}`` of every ``etcd`` executable an :class:`EtcdServer` of this process started."""
    with _started_etcd_lock:
        return dict(_started_etcd)


class EtcdServer(_ManagedServer):
    """A throwaway etcd member (v3 API only) on 127.0.0.1.

    The ``etcd`` executable is the one :func:`require_binary` finds (see
    ``AIOELECT_TEST_ETCD_DIR`` and ``AIOELECT_TEST_ETCD_VERSION`` there);
    :attr:`binary_version` is what it reports, logged at INFO on every start,
    and :meth:`server_version` is what the running member reports.

    By default a single-member cluster.  ``initial_cluster`` / ``name`` /
    ports are set by :class:`EtcdCluster` to make it one member of many.
    ``extra_args`` are appended to the etcd command line (e.g. TLS flags; use
    ``client_scheme="https"`` with TLS client listeners).  Readiness is
    checked on the plain-HTTP metrics listener's ``/health`` (which requires
    a raft leader), so it works with TLS client listeners too.
    """

    kind = "etcd"

    def __init__(
        self,
        *,
        name: str = "aioelect",
        client_port: int | None = None,
        peer_port: int | None = None,
        metrics_port: int | None = None,
        initial_cluster: str | None = None,
        cluster_token: str | None = None,
        client_scheme: str = "http",
        snapshot_count: int = 1000,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        self._etcd = require_binary("etcd")
        self.binary_version = etcd_tool_version(self._etcd, "etcd")
        super().__init__(extra_args=extra_args, startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.name = name
        self._auto_ports = client_port is None and peer_port is None and initial_cluster is None
        self._client_port = client_port if client_port is not None else free_port()
        self._peer_port = peer_port if peer_port is not None else free_port()
        self._metrics_port = metrics_port if metrics_port is not None else free_port()
        self._initial_cluster = initial_cluster
        self.cluster_token = cluster_token or f"aioelect-{secrets.token_hex(6)}"
        self.client_scheme = client_scheme
        self.snapshot_count = snapshot_count

    @property
    def binary(self) -> str:
        """Absolute path of the ``etcd`` executable this member runs."""
        return self._etcd

    @property
    def port(self) -> int:
        """Client port."""
        return self._client_port

    @property
    def peer_port(self) -> int:
        return self._peer_port

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` of the client listener."""
        return f"{self.host}:{self._client_port}"

    @property
    def endpoints(self) -> list[str]:
        """``[endpoint]`` (same shape as :attr:`EtcdCluster.endpoints`)."""
        return [self.endpoint]

    @property
    def client_url(self) -> str:
        return f"{self.client_scheme}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self._peer_port}"

    @property
    def metrics_url(self) -> str:
        """``http://127.0.0.1:M/metrics`` (Prometheus text format)."""
        return f"http://{self.host}:{self._metrics_port}/metrics"

    @property
    def health_url(self) -> str:
        return f"http://{self.host}:{self._metrics_port}/health"

    def _reassign_ports(self) -> bool:
        if self._initial_cluster is not None:
            return False
        self._client_port, self._peer_port, self._metrics_port = free_port(), free_port(), free_port()
        return True

    def _argv(self) -> list[str]:
        initial_cluster = self._initial_cluster or f"{self.name}={self.peer_url}"
        return [
            self._etcd,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={initial_cluster}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self.cluster_token}",
            f"--listen-metrics-urls=http://{self.host}:{self._metrics_port}",
            "--enable-v2=false",
            f"--snapshot-count={self.snapshot_count}",
            "--logger=zap",
            "--log-outputs=stderr",
            *self.extra_args,
        ]

    def _spawn(self) -> None:
        super()._spawn()
        with _started_etcd_lock:
            _started_etcd[self._etcd] = self.binary_version
        log.info("starting etcd %s (%s) as %s on %s", self.binary_version, self._etcd, self.name, self.client_url)

    def _probe(self) -> bool:
        return self.healthy(timeout=1.0)

    def server_version(self, timeout: float = 2.0) -> str:
        """The version the running member reports (``etcd_server_version`` on its metrics listener)."""
        url = self.metrics_url
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
        match = re.search(r'^etcd_server_version\{server_version="([^"]+)"\} 1', text, re.M)
        if match is None:
            raise HarnessError(f"{url} has no etcd_server_version metric")
        return match.group(1)

    def healthy(self, timeout: float = 2.0) -> bool:
        """True if the member's ``/health`` reports healthy (it sees a leader)."""
        try:
            data = _http_json(self.health_url, timeout)
        except (OSError, ValueError):
            return False
        return str(data.get("health")).lower() == "true"

    def status(self, timeout: float = 2.0) -> dict[str, Any]:
        """``Maintenance.Status`` of this member via the JSON gateway (HTTP client URL only)."""
        data = _http_json(f"{self.client_url}/v3/maintenance/status", timeout, body=b"{}")
        assert isinstance(data, dict)
        return data

    def etcdctl(self, *args: str, timeout: float = 10.0, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``etcdctl --endpoints=<this member> ARGS`` with ``ETCDCTL_API=3``.

        The command is bounded by ``timeout`` (also passed as etcdctl's
        ``--command-timeout``); on expiry ``subprocess.TimeoutExpired`` is
        raised.  ``check=True`` raises ``CalledProcessError`` on failure.
        """
        return _etcdctl(self.endpoints, args, timeout=timeout, check=check)


def _etcdctl(
    endpoints: Sequence[str], args: Sequence[str], *, timeout: float, check: bool
) -> subprocess.CompletedProcess[str]:
    binary = require_binary("etcdctl")
    env = dict(os.environ, ETCDCTL_API="3")
    argv = [
        binary,
        f"--endpoints={','.join(endpoints)}",
        "--dial-timeout=2s",
        f"--command-timeout={max(timeout - 0.5, 0.5):.1f}s",
        *args,
    ]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=check)


class EtcdCluster(_Started):
    """A throwaway multi-member etcd cluster (default three members) on 127.0.0.1.

    ``members`` are :class:`EtcdServer` objects sharing one
    ``--initial-cluster``; each can be killed, frozen, stopped and started
    again individually (it rejoins with its data).  ``start()`` returns once
    every member reports healthy.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        require_binary("etcd")
        token = f"aioelect-cluster-{secrets.token_hex(6)}"
        names = [f"aioelect-{i}" for i in range(size)]
        peer_ports = [free_port() for _ in names]
        initial = ",".join(f"{n}=http://{LOOPBACK}:{p}" for n, p in zip(names, peer_ports, strict=True))
        self.startup_timeout = startup_timeout
        self._cleaned = False
        self.members: list[EtcdServer] = []
        try:
            for name, peer_port in zip(names, peer_ports, strict=True):
                self.members.append(
                    EtcdServer(
                        name=name,
                        client_port=free_port(),
                        peer_port=peer_port,
                        initial_cluster=initial,
                        cluster_token=token,
                        extra_args=extra_args,
                        startup_timeout=startup_timeout,
                        stop_timeout=stop_timeout,
                    )
                )
        except BaseException:
            for member in self.members:
                member.cleanup()
            raise
        _register(self)

    @property
    def endpoints(self) -> list[str]:
        """Client endpoints (``127.0.0.1:PORT``) of all members, live or not."""
        return [m.endpoint for m in self.members]

    def start(self) -> None:
        """Start every member that is not running; wait until all are healthy (bounded)."""
        starting = [m for m in self.members if not m.running]
        for member in starting:
            member._spawn()
        deadline = time.monotonic() + self.startup_timeout
        try:
            for member in starting:
                member._wait_ready(deadline)
                member._ever_ready = True
        except BaseException:
            for member in starting:
                member.kill()
            raise

    def stop(self) -> None:
        """Gracefully stop every member."""
        for member in self.members:
            member.stop()

    def kill(self) -> None:
        """SIGKILL every member."""
        for member in self.members:
            member.kill()

    def leader(self, timeout: float = 5.0) -> EtcdServer | None:
        """The member that currently leads, or None if none is known within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for member in self.members:
                if not member.running or member.frozen:
                    continue
                try:
                    status = member.status(timeout=1.0)
                except (OSError, ValueError):
                    continue
                leader_id = str(status.get("leader", ""))
                if leader_id and leader_id != "0" and leader_id == str(status["header"].get("member_id")):
                    return member
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def etcdctl(self, *args: str, timeout: float = 10.0, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``etcdctl`` against all member endpoints (see :meth:`EtcdServer.etcdctl`)."""
        return _etcdctl(self.endpoints, args, timeout=timeout, check=check)

    def cleanup(self) -> None:
        """Kill every member and delete all data directories.  Idempotent."""
        if self._cleaned:
            return
        for member in self.members:
            member.kill()
        for member in self.members:
            member.cleanup()
        self._cleaned = True
        _unregister(self)


# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------


class PostgresServer(_OnePortServer):
    """A throwaway PostgreSQL cluster on 127.0.0.1 (``initdb -A trust -U postgres``).

    When the test process runs as root, ``initdb`` and ``postgres`` run as the
    ``os_user`` system account (default ``postgres``), which owns the
    directory.  ``fsync=off``: data survives a server crash (``kill()``) but
    not an OS crash.  ``stop()`` uses a fast shutdown (SIGINT), and
    ``kill()``/``freeze()`` also reach the per-connection backend processes.
    """

    kind = "postgres"
    stop_signal = signal.SIGINT

    def __init__(
        self,
        *,
        port: int | None = None,
        os_user: str = "postgres",
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        _require_module("asyncpg", "PostgresServer")  # start() and query() use it
        self._initdb = require_binary("initdb")
        self._postgres = require_binary("postgres", search_dirs=[os.path.dirname(self._initdb)])
        run_as: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                run_as = pwd.getpwnam(os_user)
            except KeyError:
                raise MissingBinaryError(
                    f"running as root but system user {os_user!r} (needed to run postgres) does not exist"
                ) from None
        super().__init__(port=port, extra_args=extra_args, startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self._user = run_as
        if run_as is not None:
            os.chown(self._dir, run_as.pw_uid, run_as.pw_gid)

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres``."""
        return f"postgresql://postgres@{self.host}:{self._port}/postgres"

    def _run_as(self) -> pwd.struct_passwd | None:
        return self._user

    def _prepare(self) -> None:
        argv = [self._initdb, "-A", "trust", "-U", "postgres", "-D", self.data_dir]
        argv += ["--no-sync", "--encoding=UTF8", "--locale=C"]
        _run_bounded(argv, log_path=self.log_path, timeout=120.0, what="initdb", run_as=self._user, cwd=self._dir)

    def _argv(self) -> list[str]:
        settings = {
            "listen_addresses": LOOPBACK,
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            "max_connections": "200",
        }
        argv = [self._postgres, "-D", self.data_dir, "-p", str(self._port), "-k", self._dir]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        return [*argv, *self.extra_args]

    def _pidfile_ready(self) -> bool:
        # pg_ctl's own readiness test: line 8 of postmaster.pid becomes "ready".
        try:
            with open(os.path.join(self.data_dir, "postmaster.pid")) as fh:
                lines = fh.read().splitlines()
        except OSError:
            return False
        if len(lines) < 8 or self._proc is None:
            return False
        return lines[0].strip() == str(self._proc.pid) and lines[7].strip() == "ready"

    def _probe(self) -> bool:
        if not self._pidfile_ready():
            return False
        return self.query("SELECT 1", timeout=2.0) == [(1,)]

    def query(
        self, sql: str, args: Sequence[Any] | None = None, *, database: str = "postgres", timeout: float = 5.0
    ) -> list[tuple[Any, ...]]:
        """Run one statement as ``postgres`` on a new short-lived connection.

        ``args`` uses ``$1``-style placeholders.  Returns all rows as tuples
        (``[]`` if none).  The whole call (connect + query + close) is bounded
        by ``timeout`` (raises ``TimeoutError``).  It runs asyncpg in a
        private event loop on a private thread, so it is safe to call from
        sync tests and from inside a running event loop (it blocks it).
        """
        import asyncpg

        params = list(args or ())
        dsn = f"postgresql://postgres@{self.host}:{self._port}/{urllib.parse.quote(database)}"

        async def run() -> list[tuple[Any, ...]]:
            conn = await asyncpg.connect(dsn, timeout=timeout)
            try:
                rows = await conn.fetch(sql, *params, timeout=timeout)
            except BaseException:
                conn.terminate()
                raise
            with contextlib.suppress(Exception):
                await conn.close(timeout=1.0)
            return [tuple(row) for row in rows]

        return _run_coroutine(run, timeout)


# ---------------------------------------------------------------------------
# Fault-injecting TCP proxy
# ---------------------------------------------------------------------------

_BUFFER_LIMIT = 256 * 1024


class _Pair:
    __slots__ = (
        "c2u",
        "client",
        "client_eof",
        "client_shut",
        "connecting",
        "u2c",
        "upstream",
        "upstream_eof",
        "upstream_shut",
    )

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.connecting = False
        self.c2u = bytearray()
        self.u2c = bytearray()
        self.client_eof = False
        self.upstream_eof = False
        self.upstream_shut = False
        self.client_shut = False


def _abort_socket(sock: socket.socket | None) -> None:
    """Close ``sock`` with a TCP RST (SO_LINGER 0)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(OSError):
        sock.close()


class TCPProxy:
    """A fault-injecting TCP proxy from 127.0.0.1:``port`` to ``target``.

    It runs on its own daemon thread, so it works with any event loop (or
    none) and for clients in other processes.  Modes (each method returns
    only once the proxy thread has applied it):

    * :meth:`passthrough` / :meth:`heal` -- forward bytes both ways.  Client
      connections accepted while stalled get their upstream connection now.
    * :meth:`stall` -- silent partition: every connection stays open but no
      byte moves in either direction; new connections are accepted (the
      kernel completes the handshake) and then hang too.  Nothing is lost:
      buffered bytes flow again after :meth:`heal`.
    * :meth:`drop` -- every current connection is reset (RST on both sides),
      and new connections are accepted and immediately reset.

    If the target refuses or resets, the client connection is reset too.
    """

    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((LOOPBACK, listen_port))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self._port = int(self._listener.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "listener")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._masks: dict[socket.socket, int] = {}
        self._pairs: list[_Pair] = []
        self._mode = "passthrough"
        self._commands: queue.SimpleQueue[tuple[Callable[[], None], threading.Event]] = queue.SimpleQueue()
        self._closed = False
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"aioelect-proxy-{self._port}", daemon=True)
        self._thread.start()
        _register(self)

    # -- public API ------------------------------------------------------------

    host = LOOPBACK

    @property
    def port(self) -> int:
        """Listening port on 127.0.0.1."""
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """``("127.0.0.1", port)``."""
        return (LOOPBACK, self._port)

    @property
    def endpoint(self) -> str:
        """``"127.0.0.1:PORT"``."""
        return f"{LOOPBACK}:{self._port}"

    @property
    def mode(self) -> str:
        """``"passthrough"``, ``"stall"`` or ``"drop"``."""
        return self._mode

    @property
    def connection_count(self) -> int:
        """Client connections currently held by the proxy."""
        return len(self._pairs)

    def passthrough(self) -> None:
        """Forward bytes in both directions (the initial mode)."""
        self._call(lambda: self._set_mode("passthrough"))

    heal = passthrough

    def stall(self) -> None:
        """Keep connections open but forward nothing (silent partition)."""
        self._call(lambda: self._set_mode("stall"))

    def drop(self) -> None:
        """Reset all connections now and reset new ones until healed."""
        self._call(lambda: self._set_mode("drop"))

    def close(self) -> None:
        """Reset all connections, stop listening and stop the thread.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            with contextlib.suppress(TimeoutError):
                self._call(self._request_stop)
            self._thread.join(5.0)
        _unregister(self)

    def __enter__(self) -> TCPProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TCPProxy {self.endpoint} -> {self.target[0]}:{self.target[1]} {self._mode}>"

    # -- thread side -------------------------------------------------------------

    def _call(self, func: Callable[[], None], timeout: float = 5.0) -> None:
        if threading.current_thread() is self._thread:
            func()
            return
        if not self._thread.is_alive():
            raise HarnessError(f"proxy thread is not running (error: {self._error!r})")
        done = threading.Event()
        self._commands.put((func, done))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if not done.wait(timeout):
            raise TimeoutError("proxy thread did not respond")

    def _request_stop(self) -> None:
        self._stopping = True

    def _set_mode(self, mode: str) -> None:
        self._mode = mode
        if mode == "drop":
            for pair in list(self._pairs):
                self._abort(pair)

    def _abort(self, pair: _Pair) -> None:
        for sock in (pair.client, pair.upstream):
            if sock is not None:
                self._set_mask(sock, 0, pair)
        _abort_socket(pair.client)
        _abort_socket(pair.upstream)
        with contextlib.suppress(ValueError):
            self._pairs.remove(pair)

    def _finish(self, pair: _Pair) -> None:
        for sock in (pair.client, pair.upstream):
            if sock is not None:
                self._set_mask(sock, 0, pair)
                with contextlib.suppress(OSError):
                    sock.close()
        with contextlib.suppress(ValueError):
            self._pairs.remove(pair)

    def _set_mask(self, sock: socket.socket, mask: int, pair: _Pair) -> None:
        current = self._masks.get(sock, 0)
        if mask == current:
            return
        try:
            if mask == 0:
                self._sel.unregister(sock)
                del self._masks[sock]
            elif current == 0:
                self._sel.register(sock, mask, pair)
                self._masks[sock] = mask
            else:
                self._sel.modify(sock, mask, pair)
                self._masks[sock] = mask
        except (KeyError, ValueError, OSError):
            self._masks.pop(sock, None)

    def _connect_upstream(self, pair: _Pair) -> None:
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setblocking(False)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = upstream.connect_ex(self.target)
        pair.upstream = upstream
        if err in (0, errno.EISCONN):
            pair.connecting = False
        elif err in (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK):
            pair.connecting = True
        else:
            self._abort(pair)

    def _update_interest(self) -> None:
        passing = self._mode == "passthrough"
        for pair in list(self._pairs):
            if passing and pair.upstream is None:
                if pair.client_eof and not pair.c2u:
                    self._finish(pair)
                    continue
                self._connect_upstream(pair)
                if pair not in self._pairs:
                    continue
            client_mask = 0
            upstream_mask = 0
            if passing:
                if not pair.client_eof and len(pair.c2u) < _BUFFER_LIMIT:
                    client_mask |= selectors.EVENT_READ
                if pair.u2c:
                    client_mask |= selectors.EVENT_WRITE
                if pair.connecting:
                    upstream_mask = selectors.EVENT_WRITE
                elif pair.upstream is not None:
                    if not pair.upstream_eof and len(pair.u2c) < _BUFFER_LIMIT:
                        upstream_mask |= selectors.EVENT_READ
                    if pair.c2u:
                        upstream_mask |= selectors.EVENT_WRITE
            self._set_mask(pair.client, client_mask, pair)
            if pair.upstream is not None:
                self._set_mask(pair.upstream, upstream_mask, pair)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                client, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if self._mode == "drop":
                _abort_socket(client)
                continue
            client.setblocking(False)
            with contextlib.suppress(OSError):
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._pairs.append(_Pair(client))

    def _half_close(self, pair: _Pair) -> None:
        if pair.upstream is None or pair.connecting:
            return
        if pair.client_eof and not pair.c2u and not pair.upstream_shut:
            pair.upstream_shut = True
            with contextlib.suppress(OSError):
                pair.upstream.shutdown(socket.SHUT_WR)
        if pair.upstream_eof and not pair.u2c and not pair.client_shut:
            pair.client_shut = True
            with contextlib.suppress(OSError):
                pair.client.shutdown(socket.SHUT_WR)
        if pair.upstream_shut and pair.client_shut:
            self._finish(pair)

    def _handle(self, pair: _Pair, sock: socket.socket, mask: int) -> None:
        if pair not in self._pairs or self._mode != "passthrough":
            return
        is_client = sock is pair.client
        if not is_client and pair.connecting:
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._abort(pair)
                return
            pair.connecting = False
            return
        try:
            if mask & selectors.EVENT_READ:
                data = sock.recv(65536)
                if is_client:
                    if data:
                        pair.c2u += data
                    else:
                        pair.client_eof = True
                elif data:
                    pair.u2c += data
                else:
                    pair.upstream_eof = True
            if mask & selectors.EVENT_WRITE:
                buf = pair.u2c if is_client else pair.c2u
                if buf:
                    sent = sock.send(buf)
                    del buf[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._abort(pair)
            return
        self._half_close(pair)

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._update_interest()
                for key, mask in self._sel.select(timeout=0.5):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                        self._drain_commands()
                    else:
                        self._handle(key.data, key.fileobj, mask)  # type: ignore[arg-type]
                self._drain_commands()
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            for pair in list(self._pairs):
                self._abort(pair)
            self._drain_commands()
            with contextlib.suppress(Exception):
                self._sel.close()
            for sock in (self._listener, self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    sock.close()

    def _drain_commands(self) -> None:
        while True:
            try:
                func, done = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                func()
            finally:
                done.set()


# ---------------------------------------------------------------------------
# Pytest plugin
# ---------------------------------------------------------------------------
#
# Fixtures are only defined when pytest is already imported (always true under
# pytest), so plain imports of this module never import pytest.

ENV_MYSQL_DSN = "AIOELECT_MYSQL_DSN"
ENV_ETCD_ENDPOINTS = "AIOELECT_ETCD_ENDPOINTS"
ENV_POSTGRES_DSN = "AIOELECT_POSTGRES_DSN"
ENV_REQUIRE_SERVERS = "AIOELECT_REQUIRE_SERVERS"

_EXTERNAL_ENV = {
    "mysql": ENV_MYSQL_DSN,
    "mariadb": ENV_MYSQL_DSN,
    "etcd": ENV_ETCD_ENDPOINTS,
    "postgres": ENV_POSTGRES_DSN,
}


def servers_required() -> bool:
    """True when missing server binaries must fail tests instead of skipping them.

    That is when ``CI`` is ``true``/``1``/``yes`` or ``AIOELECT_REQUIRE_SERVERS=1``.
    """
    ci = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")
    required = os.environ.get(ENV_REQUIRE_SERVERS, "").strip().lower() in ("1", "true", "yes")
    return ci or required


def external_server(kind: str) -> str | None:
    """The external server configured for ``kind`` (``mysql``/``etcd``/``postgres``), or None."""
    value = os.environ.get(_EXTERNAL_ENV[kind], "").strip()
    return value or None


__all__ += ["servers_required", "external_server", "started_etcd_versions", "etcd_version_matches"]


# ---------------------------------------------------------------------------
# TLS certificates
# ---------------------------------------------------------------------------


class Certificates:
    """A throwaway CA with a server certificate (for ``127.0.0.1``/``localhost``) and a client certificate.

    All files are PEM in :attr:`directory`: ``ca.pem``, ``server.pem``,
    ``server-key.pem``, ``client.pem``, ``client-key.pem``, and a second,
    unrelated CA ``other-ca.pem`` for "wrong CA" tests. Keys are unencrypted
    and world-readable so that servers running as another user can read them.
    """

    def __init__(self, directory: str | None = None, *, client_cn: str = "aioelect-client") -> None:
        self.directory = directory or tempfile.mkdtemp(prefix="aioelect-certs-")
        self.client_cn = client_cn
        d = self.directory
        self.ca = os.path.join(d, "ca.pem")
        self.ca_key = os.path.join(d, "ca-key.pem")
        self.other_ca = os.path.join(d, "other-ca.pem")
        self.server_cert = os.path.join(d, "server.pem")
        self.server_key = os.path.join(d, "server-key.pem")
        self.client_cert = os.path.join(d, "client.pem")
        self.client_key = os.path.join(d, "client-key.pem")
        openssl = require_binary("openssl")
        log = os.path.join(d, "openssl.log")

        def run(*args: str) -> None:
            _run_bounded([openssl, *args], log_path=log, timeout=60.0, what="openssl")

        for cert, key, cn in ((self.ca, self.ca_key, "aioelect-test-ca"), (self.other_ca, None, "unrelated-ca")):
            run(
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-subj", f"/CN={cn}", "-keyout", key or os.path.join(d, "other-ca-key.pem"), "-out", cert,
            )  # fmt: skip
        ext = os.path.join(d, "server.ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
        for cert, key, cn, extfile in (
            (self.server_cert, self.server_key, "127.0.0.1", ext),
            (self.client_cert, self.client_key, client_cn, None),
        ):
            csr = cert + ".csr"
            run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", key, "-out", csr)
            sign = ["x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial"]
            sign += ["-days", "2", "-out", cert]
            if extfile:
                sign += ["-extfile", extfile]
            run(*sign)
        for name in os.listdir(d):
            os.chmod(os.path.join(d, name), 0o644)
        os.chmod(d, 0o755)

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


__all__ += ["Certificates"]

if TYPE_CHECKING or "pytest" in sys.modules:
    import pytest

    def server_unavailable(reason: str) -> NoReturn:
        """Skip the current test, or fail it when :func:`servers_required` (CI)."""
        if servers_required():
            pytest.fail(f"{reason} (servers are required: CI / {ENV_REQUIRE_SERVERS} is set)", pytrace=False)
        pytest.skip(reason)

    def skip_if_external(kind: str) -> None:
        """Skip a test that needs a local, controllable server when ``kind`` is external.

        Fault-injection tests (kill/freeze/restart) cannot run against a
        server given by ``AIOELECT_MYSQL_DSN`` / ``AIOELECT_ETCD_ENDPOINTS`` /
        ``AIOELECT_POSTGRES_DSN``; this is a deliberate configuration, so it
        skips even in CI.
        """
        value = external_server(kind)
        if value is not None:
            pytest.skip(f"{_EXTERNAL_ENV[kind]} is set: test needs a local {kind} server it can control")

    def _serve(factory: Callable[[], _S]) -> Iterator[_S]:
        try:
            server = factory()
        except MissingBinaryError as exc:
            server_unavailable(str(exc))
        try:
            server.start()
            yield server
        finally:
            server.cleanup()

    def _dsn(request: pytest.FixtureRequest, kind: str, fixture: str) -> str:
        """The external server's DSN for ``kind`` if one is set, else that of the session ``fixture``."""
        value = external_server(kind)
        return value if value is not None else str(request.getfixturevalue(fixture).dsn)

    @pytest.fixture(scope="session")
    def mariadb() -> Iterator[MariaDBServer]:
        """Session-wide local MariaDB (do not kill/freeze it: use ``fresh_mariadb``)."""
        skip_if_external("mysql")
        yield from _serve(MariaDBServer)

    @pytest.fixture(scope="session")
    def mysql_dsn(request: pytest.FixtureRequest) -> str:
        """``AIOELECT_MYSQL_DSN`` if set, else the DSN of the session ``mariadb``."""
        return _dsn(request, "mysql", "mariadb")

    @pytest.fixture(scope="session")
    def etcd() -> Iterator[EtcdServer]:
        """Session-wide local single-member etcd (do not kill/freeze it: use ``fresh_etcd``)."""
        skip_if_external("etcd")
        yield from _serve(EtcdServer)

    @pytest.fixture(scope="session")
    def etcd_endpoints(request: pytest.FixtureRequest) -> list[str]:
        """``AIOELECT_ETCD_ENDPOINTS`` (comma-separated) if set, else the session ``etcd``'s."""
        value = external_server("etcd")
        if value is not None:
            return [e.strip() for e in value.split(",") if e.strip()]
        server: EtcdServer = request.getfixturevalue("etcd")
        return server.endpoints

    @pytest.fixture(scope="session")
    def postgres() -> Iterator[PostgresServer]:
        """Session-wide local PostgreSQL (do not kill/freeze it: use ``fresh_postgres``)."""
        skip_if_external("postgres")
        yield from _serve(PostgresServer)

    @pytest.fixture(scope="session")
    def postgres_dsn(request: pytest.FixtureRequest) -> str:
        """``AIOELECT_POSTGRES_DSN`` if set, else the DSN of the session ``postgres``."""
        return _dsn(request, "postgres", "postgres")

    @pytest.fixture
    def fresh_mariadb() -> Iterator[MariaDBServer]:
        """A private MariaDB for one test; kill/freeze/restart it freely."""
        yield from _serve(MariaDBServer)

    @pytest.fixture
    def fresh_etcd() -> Iterator[EtcdServer]:
        """A private single-member etcd for one test; kill/freeze/restart it freely."""
        yield from _serve(EtcdServer)

    @pytest.fixture
    def fresh_postgres() -> Iterator[PostgresServer]:
        """A private PostgreSQL for one test; kill/freeze/restart it freely."""
        yield from _serve(PostgresServer)

    @pytest.fixture
    def etcd_cluster() -> Iterator[EtcdCluster]:
        """A private, started three-member etcd cluster for one test."""
        yield from _serve(lambda: EtcdCluster(3))

    @pytest.fixture(scope="module")
    def certs() -> Iterator[Certificates]:
        """A CA with server (127.0.0.1) and client certificates for one test module, removed afterwards."""
        try:
            certificates = Certificates()
        except MissingBinaryError as exc:
            server_unavailable(str(exc))
        try:
            yield certificates
        finally:
            certificates.cleanup()

    @pytest.fixture
    def tcp_proxy_factory() -> Iterator[Callable[[str, int], TCPProxy]]:
        """``make(host, port) -> TCPProxy``; every proxy made is closed after the test."""
        proxies: list[TCPProxy] = []

        def make(host: str, port: int) -> TCPProxy:
            proxy = TCPProxy(host, port)
            proxies.append(proxy)
            return proxy

        try:
            yield make
        finally:
            for proxy in proxies:
                proxy.close()

    def _etcd_tools_line() -> str:
        """Which ``etcd``/``etcdctl`` the harness uses, and their versions (errors are shown, not raised)."""
        parts = []
        for tool in ("etcd", "etcdctl"):
            try:
                path = require_binary(tool)
                parts.append(f"{tool} {etcd_tool_version(path, tool)} ({path})")
            except HarnessError as exc:
                parts.append(f"{tool}: {exc}")
        pinned = [f"{env}={os.environ[env]}" for env in (ENV_ETCD_DIR, ENV_ETCD_VERSION) if os.environ.get(env)]
        return "aioelect.testing etcd: " + ", ".join(parts) + (f" [{' '.join(pinned)}]" if pinned else "")

    def pytest_report_header(config: pytest.Config) -> list[str]:
        """The etcd version under test, in the header of every run (hidden by ``-q``)."""
        return [_etcd_tools_line()]

    def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
        """The etcd versions that really ran, at the end of every run (``-q`` too) that started one."""
        started = started_etcd_versions()
        if started:
            ran = ", ".join(f"etcd {version} ({path})" for path, version in sorted(started.items()))
            terminalreporter.write_line(f"aioelect.testing started: {ran}")

    __all__ += [
        "server_unavailable",
        "skip_if_external",
        "mariadb",
        "mysql_dsn",
        "etcd",
        "etcd_endpoints",
        "postgres",
        "postgres_dsn",
        "fresh_mariadb",
        "fresh_etcd",
        "fresh_postgres",
        "etcd_cluster",
        "certs",
        "tcp_proxy_factory",
    ]
