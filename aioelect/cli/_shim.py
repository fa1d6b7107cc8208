"""Between ``aioelect run`` and CMD (Linux): a child subreaper that leaves no descendant of CMD behind.

Started by :class:`aioelect.cli._tree.ProcessTree` as
``python -I -S _shim.py FD HOLD CGROUP CMD [ARGS...]``, FD being one end of a
socket pair whose other end only the supervisor holds, HOLD the
comma-separated descriptors (or ``-``) it keeps open until it exits and
does not pass on to CMD: the leadership's lock file or server session,
which then cannot pass to another candidate while CMD's tree lives; CGROUP
a cgroup v2 directory (or ``-``) it moves itself into before it starts CMD,
so that CMD's whole tree is in it. It imports nothing but the
standard library, so it starts in milliseconds, and nothing of aioelect.

Guarantees:

* it is a child subreaper (``PR_SET_CHILD_SUBREAPER``): every process CMD
  starts stays its descendant, whatever it does with sessions, process
  groups or double forks, and it reaps every one of them (no zombies pile
  up, even when aioelect runs as PID 1);
* CMD runs in a process group of its own (its pid), with its signals at
  their defaults, and gets SIGKILL if the shim dies (``PR_SET_PDEATHSIG``);
* when the socket reaches end of file (the supervisor is gone, whatever
  killed it, SIGKILL included) or the supervisor sends ``kill``, it
  SIGKILLs every descendant (a process whose main thread ended alone
  through its live threads; the process groups of the sessions started in
  the tree at once), again and again until waitpid says no child is left
  but zombies a tracer holds, and exits;
* otherwise it exits once CMD has exited and no child is left (every
  orphan of the tree is reparented to it), so its own exit means the whole
  tree is gone.

It cannot protect itself from CMD (which may stop, trace or kill it): the
supervisor finds the tree without it (the cgroup, /proc) and kills it too.
It ignores the signals ``aioelect run`` forwards (the supervisor signals
CMD's processes itself, each once). Messages, one line each: to the
supervisor ``pid N CGROUP`` once CMD runs (CGROUP ``in`` if the tree is in
the cgroup, ``-`` if none was given, else the errno of the failed move),
``error ERRNO`` if CMD could not be executed, and ``exit RETURNCODE LEFT``
when CMD has exited (RETURNCODE as :mod:`subprocess` gives it, -N for
signal N; LEFT the descendants still alive then); from the supervisor
``kill``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: Signals aioelect run forwards to CMD's group: the shim stays, to clean up after CMD.
_IGNORED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGPIPE,
)
#: Signals Python itself sets to ignored at start; CMD gets them at their defaults, as subprocess does.
_RESTORED = (*_IGNORED, signal.SIGCHLD, getattr(signal, "SIGXFSZ", signal.SIGPIPE))


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def processes() -> Iterator[tuple[int, list[bytes]]]:
    """Every process in /proc as ``(pid, fields)``, the fields of its ``stat`` after the name: state, ppid, pgid..."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        yield int(entry), fields


def live_threads(pid: int) -> list[int]:
    """The threads of ``pid`` that are neither zombies nor dead (a main thread that ended alone, with
    SYS_exit, leaves ``stat`` saying Z while the process's other threads run on)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append(int(task))
    return found


def live(pid: int, state: bytes) -> bool:
    """Whether ``pid``, whose ``stat`` says ``state``, is alive: not a zombie, or a zombie main thread whose
    process still has a live thread."""
    return state not in (b"Z", b"X") or bool(live_threads(pid))


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool | None:
    """Whether ``pid`` is alive (see :func:`live`); None if it is gone."""
    fields = _stat_fields(pid)
    return None if not fields else live(pid, fields[0])


def signal_process(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``; if its main thread has ended alone, to its live threads instead (SIGKILL to
    each, any other signal to one: it is the process's either way)."""
    fields = _stat_fields(pid)
    tids = live_threads(pid) if fields and fields[0] in (b"Z", b"X") else []
    for target in (tids if sig == signal.SIGKILL else tids[:1]) or [pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)


def kill_sessions(pids: Iterable[int]) -> None:
    """SIGKILL the process group of each of ``pids`` (zombies included) that is in a session other than this
    process's: a session started inside CMD's tree (only its descendants can be in it), whose group outlives
    any one pid, so a process that forks and lets its parent exit again and again is caught all the same."""
    mine = os.getsid(0)
    groups: set[int] = set()
    for pid in pids:
        fields = _stat_fields(pid)
        if fields and len(fields) > 3 and int(fields[3]) not in (mine, 0) and int(fields[2]) > 1:
            groups.add(int(fields[2]))
    for group in groups:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)


def _children(pid: int) -> list[tuple[int, bool]] | None:
    """``pid``'s children as ``(pid, alive)``, from /proc/PID/task/*/children (None where the kernel has none)."""
    found: list[tuple[int, bool]] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as fh:
                listed = fh.read().split()
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{task}"):
                continue  # the thread ended
            return None
        except OSError:
            continue
        for child in map(int, listed):
            alive = _alive(child)
            if alive is not None:
                found.append((child, alive))
    return found


def _children_by_scan() -> Callable[[int], list[tuple[int, bool]] | None]:
    """What :func:`_children` gives, from one pass over every process's ``stat``."""
    table: dict[int, list[tuple[int, bool]]] = {}
    for pid, fields in processes():
        table.setdefault(int(fields[1]), []).append((pid, live(pid, fields[0])))
    return lambda pid: table.get(pid, [])


def descendants(root: int, depth: int | None = None) -> list[tuple[int, bool]]:
    """Every descendant of ``root`` (``depth`` generations down at most) as ``(pid, alive)``, alive meaning
    not a zombie (read from /proc: the tree's own ``children`` files, else every process's ``stat``)."""
    children_of: Callable[[int], list[tuple[int, bool]] | None] = _children
    found: list[tuple[int, bool]] = []
    todo = [(root, 0)]
    while todo:
        parent, level = todo.pop()
        if depth is not None and level >= depth:
            continue
        children = children_of(parent)
        if children is None:  # no children files: one pass over every process instead, then start over
            children_of = _children_by_scan()
            found, todo = [], [(root, 0)]
            continue
        for child in children:
            found.append(child)
            todo.append((child[0], level + 1))
    return found


def _signal_all(sig: int) -> int:
    """Send ``sig`` to every live descendant (SIGKILL also to the groups of the tree's own sessions); how many
    live descendants there were."""
    found = descendants(os.getpid())
    if sig == signal.SIGKILL:
        kill_sessions(pid for pid, _ in found)
    running = [pid for pid, alive in found if alive]
    for pid in running:
        signal_process(pid, sig)
    return len(running)


def _reap() -> tuple[list[tuple[int, int]], bool]:
    """Reap every child that has exited: their ``(pid, wait status)``, and whether any child is left."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped, False
        if pid == 0:
            return reaped, True
        reaped.append((pid, status))


def _no_child_left() -> bool:
    """Whether, once reaped, no child is left but zombies a tracer holds (this process cannot reap them; they
    have closed every descriptor): waitpid, not /proc, says whether a child is left, so a process that forks
    and lets its parent exit again and again, whose every pid is gone by the time /proc is read, still counts.
    The zombies must be the same twice 10 ms apart (such a process leaves new ones)."""
    seen: set[int] | None = None
    for _ in range(2):
        _, left = _reap()
        if not left:
            return True
        children = _children(os.getpid())
        if children is None:
            children = _children_by_scan()(os.getpid()) or []
        now = {pid for pid, _ in children}
        if not now or any(alive for _, alive in children) or (seen is not None and now != seen):
            return False
        seen = now
        time.sleep(0.01)
    return True


def _kill_all(group: int | None) -> None:
    """SIGKILL every descendant until none is left alive (a process forking meanwhile is caught on the next pass).

    ``group``: CMD's process group, while CMD is not reaped (so its id cannot have been reused).
    """
    if group is not None:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)  # at once, before the slower walk through /proc
    while True:
        killed = _signal_all(signal.SIGKILL)
        if not killed and _no_child_left():
            return
        time.sleep(0.001)  # let the killed exit before the next pass


def _join(cgroup: str) -> str:
    """Move this process into ``cgroup`` (``-``: none): ``in``, ``-``, or the errno that prevented it."""
    if cgroup == "-":
        return "-"
    try:
        fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY)  # never created: the kernel's, or none
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    except OSError as exc:
        return str(exc.errno or 0)
    return "in"


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[1]))
    sock.set_inheritable(False)
    for held in argv[2].split(",") if argv[2] != "-" else ():
        os.set_inheritable(int(held), False)  # kept open here until the shim exits; CMD does not get it
    joined = _join(argv[3])
    cmd = argv[4:]
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    for sig in _IGNORED:
        signal.signal(sig, lambda signum, frame: None)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    me = os.getpid()
    error_r, error_w = os.pipe()  # close-on-exec: end of file once CMD is executing
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, until exec
        try:
            os.setpgid(0, 0)
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != me:  # the shim died before PDEATHSIG was set
                os._exit(128 + signal.SIGKILL)
            signal.set_wakeup_fd(-1)
            for sig in _RESTORED:
                signal.signal(sig, signal.SIG_DFL)
            os.execvp(cmd[0], cmd)
        except OSError as exc:
            os.write(error_w, str(exc.errno or 0).encode())
        os._exit(127)
    os.close(error_w)
    with contextlib.suppress(OSError):  # CMD has exec'd (and set it) or died
        os.setpgid(pid, pid)  # also here, so CMD's group exists before the supervisor hears of it
    with os.fdopen(error_r, "rb") as fh:
        failed = fh.read()

    def send(line: str) -> bool:
        try:
            sock.sendall(line.encode() + b"\n", socket.MSG_NOSIGNAL)
        except OSError:
            return False
        return True

    if failed:
        os.waitpid(pid, 0)
        send(f"error {int(failed)}")
        return 127
    if not send(f"pid {pid} {joined}"):
        _kill_all(pid)
        return 1
    cmd_done = False
    pending = b""
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 512)
            exited, left = _reap()
            for reaped, status in exited:
                if reaped == pid:
                    cmd_done = True
                    running = sum(alive for _, alive in descendants(me))
                    if not send(f"exit {os.waitstatus_to_exitcode(status)} {running}"):
                        _kill_all(None if cmd_done else pid)
                        return 1
            if cmd_done and (not left or _no_child_left()):
                return 0
        if sock.fileno() in readable:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if not data:  # the supervisor is gone: so is everything it started
                _kill_all(None if cmd_done else pid)
                return 1
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                words = line.split()
                if words[:1] == [b"kill"]:
                    _kill_all(None if cmd_done else pid)
                    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv))  # no interpreter shutdown: the lock's descriptors close a few ms sooner
