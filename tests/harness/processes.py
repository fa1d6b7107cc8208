"""Child processes that die with the test process, and the bounded waits around them.

Guarantees:

* Every child runs in its own session and gets ``prctl(PR_SET_PDEATHSIG,
  SIGKILL)`` (Linux) from a small shim that execs the real program under the
  same pid, so it dies with the test process even when that is SIGKILLed.
  Children are forked from one long-lived harness thread: the parent-death
  signal fires when the *forking thread* exits, so forking from short-lived
  worker threads (``asyncio.to_thread``) would otherwise kill servers early.
* Children start without fork handlers of the test process running in them
  (no ``preexec_fn``, so CPython uses ``vfork``).
* Every wait here is bounded in time.
* Whatever is still :func:`track`-ed at interpreter exit is cleaned up by an
  ``atexit`` hook. A SIGKILLed test process cannot remove its temporary
  directories (``/tmp/aioelect-*``); its processes still die.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import errno
import os
import pwd
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from .errors import HarnessError, ServerStartError

__all__ = [
    "LOOPBACK",
    "descendants",
    "free_port",
    "pid_alive",
    "popen",
    "run_bounded",
    "run_coroutine",
    "signal_pid",
    "signal_tree",
    "tail",
    "track",
    "untrack",
    "wait_until",
]

_T = TypeVar("_T")

#: The only address anything of the harness listens on.
LOOPBACK = "127.0.0.1"

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


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05, what: str = "condition") -> None:
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


def popen(
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


def proc_stat(pid: int) -> tuple[str, int] | None:
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


def pid_alive(pid: int) -> bool:
    stat = proc_stat(pid)
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


def descendants(root: int) -> list[int]:
    """All live descendants of ``root`` (breadth-first), via /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        stat = proc_stat(int(entry))
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


def signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def signal_tree(root: int, sig: int) -> list[int]:
    """Send ``sig`` to ``root`` first, then to all of its descendants.

    Returns the descendants signalled.  For SIGKILL the root is SIGSTOPped
    first so it cannot fork while its tree is being collected.
    """
    if sig == signal.SIGKILL:
        signal_pid(root, signal.SIGSTOP)
        kids = descendants(root)
        for pid in kids:
            signal_pid(pid, signal.SIGSTOP)
        kids = descendants(root) or kids
        signal_pid(root, signal.SIGKILL)
        for pid in kids:
            signal_pid(pid, signal.SIGKILL)
        return kids
    signal_pid(root, sig)
    kids = descendants(root)
    for pid in kids:
        signal_pid(pid, sig)
    return kids


def tail(path: str, max_bytes: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<could not read {path}: {exc}>"


# --- cleanup registry -------------------------------------------------------

_live_lock = threading.Lock()
_live: dict[int, Callable[[], None]] = {}


def track(owner: object, cleanup: Callable[[], None]) -> None:
    """Call ``cleanup`` at interpreter exit unless ``owner`` is :func:`untrack`-ed first."""
    with _live_lock:
        _live[id(owner)] = cleanup


def untrack(owner: object) -> None:
    with _live_lock:
        _live.pop(id(owner), None)


@atexit.register
def _cleanup_everything() -> None:
    """atexit hook: clean up every server and proxy that is still alive."""
    with _live_lock:
        cleanups = list(_live.values())
    for cleanup in cleanups:
        with contextlib.suppress(Exception):
            cleanup()


def run_coroutine(factory: Callable[[], Coroutine[Any, Any, _T]], timeout: float) -> _T:
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


def run_bounded(
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
    proc = popen(argv, log_path=log_path, run_as=run_as, cwd=cwd)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        signal_tree(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10.0)
        raise ServerStartError(f"{what} did not finish in {timeout:.0f}s; log tail:\n{tail(log_path)}") from None
    if rc != 0:
        raise ServerStartError(f"{what} failed with status {rc}; log tail:\n{tail(log_path)}")
