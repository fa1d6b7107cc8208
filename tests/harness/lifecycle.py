"""The lifecycle every throwaway server shares.

``start()`` (bounded, retried once on fresh ports when the first start finds
its address in use), ``stop()``, ``kill()`` (SIGKILL of the whole process
tree), ``freeze()`` (SIGSTOP), ``thaw()`` (SIGCONT), ``restart()`` (same
ports, same data), ``cleanup()`` (stop and delete the data directory) and the
context-manager protocol. Everything listens on ``127.0.0.1`` only; a failed
start raises :class:`~tests.harness.errors.ServerStartError` with the tail of
the server log.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, ClassVar, TypeVar

from .errors import HarnessError, ServerStartError
from .processes import (
    LOOPBACK,
    descendants,
    free_port,
    pid_alive,
    popen,
    signal_pid,
    signal_tree,
    tail,
    track,
    untrack,
    wait_until,
)

__all__ = ["ManagedServer", "OnePortServer", "Started"]

_S = TypeVar("_S", bound="Started")

#: The longest :attr:`ManagedServer.socket_dir`: room left for a socket's name (``.s.PGSQL.65535``, ``mysql.sock``)
#: within the 107 bytes of a socket address.
_SOCKET_DIR_MAX = 80
_ADDRESS_IN_USE = re.compile(r"address already in use|could not bind|could not create listen socket", re.I)


class Started:
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


class ManagedServer(Started):
    """Lifecycle shared by all servers (one root process, maybe children).

    Subclasses implement ``_argv``, ``_probe`` and optionally ``_prepare``,
    ``_after_start`` and ``_reassign_ports``.
    """

    kind: ClassVar[str] = "server"
    stop_signal: ClassVar[int] = signal.SIGTERM

    host = LOOPBACK
    #: A command that runs the server in its place (``ip netns exec NS``: see :meth:`place`).
    prefix: tuple[str, ...] = ()

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
        self._short_dir: str | None = None
        self.log_path = os.path.join(self._dir, "server.log")
        self.data_dir = os.path.join(self._dir, "data")
        track(self, self.cleanup)

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

    def place(self, node: Any) -> None:
        """Run in ``node``'s network namespace, on its address (a :class:`~tests.harness.netns.Node`); before start."""
        self.host, self.prefix = node.address, tuple(node.prefix)

    # -- properties ----------------------------------------------------------

    @property
    def directory(self) -> str:
        """Temporary directory owned by this server (data, socket, log)."""
        return self._dir

    @property
    def socket_dir(self) -> str:
        """Where the server puts its Unix socket: :attr:`directory`, or a short directory of its own under /tmp when
        a deep TMPDIR (a test's ``tmp_path`` under xdist) would make the socket's path longer than the 107 bytes a
        socket address holds (the server would refuse to start)."""
        if len(self._dir) <= _SOCKET_DIR_MAX:
            return self._dir
        if self._short_dir is None:
            self._short_dir = tempfile.mkdtemp(prefix=f"aioelect-{self.kind}-", dir="/tmp")
            user = self._run_as()
            if user is not None:  # the server's own user creates its socket there
                os.chown(self._short_dir, user.pw_uid, user.pw_gid)
        return self._short_dir

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
        return tail(self.log_path, max_bytes)

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
        self._proc = popen([*self.prefix, *self._argv()], log_path=self.log_path, run_as=self._run_as(), cwd=self._dir)

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
            wait_until(lambda: not any(pid_alive(p) for p in pending), timeout, 0.02, "children to exit")

    def _kill_process(self) -> None:
        proc = self._proc
        if proc is None:
            return
        kids = signal_tree(proc.pid, signal.SIGKILL) if proc.poll() is None else []
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
            kids = descendants(proc.pid)
            signal_pid(proc.pid, self.stop_signal)
            signal_tree(proc.pid, signal.SIGCONT)
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
            signal_tree(self._proc.pid, signal.SIGSTOP)
            self._frozen = True

    def thaw(self) -> None:
        """SIGCONT the server and its children (undo :meth:`freeze`)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                signal_tree(self._proc.pid, signal.SIGCONT)
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
                if self._short_dir is not None:
                    shutil.rmtree(self._short_dir, ignore_errors=True)
                untrack(self)

    def __repr__(self) -> str:
        state = "frozen" if self.frozen else "running" if self.running else "stopped"
        return f"<{type(self).__name__} {state} dir={self._dir!r}>"


class OnePortServer(ManagedServer):
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
