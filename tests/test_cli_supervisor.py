"""``aioelect run``: no process of CMD's tree outlives the supervisor or the leadership.

CMD here starts a tree that tries every usual way out: a child in its
process group, a child in a session of its own (``setsid``), and a
double-forked grandchild (orphaned, in a session of its own), each ignoring
every catchable signal. Every process of the tree carries a marker in its
environment; the next leader's CMD looks for live processes with that marker
the moment it starts. Every process is killed at teardown, whatever happened.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .harness import EtcdServer, MariaDBServer, TCPProxy
from .test_cli import ROOT, Spawner, _env, aioelect_argv, cli, wait_until

MARKER = "AIOELECT_TEST_TREE"

IGNORED = "TERM INT HUP QUIT USR1 USR2 PIPE"

#: CMD: starts the escaping tree, writes "CMD IN-GROUP SETSID DOUBLE-FORKED" pids to argv[1], then waits for
#: its children ("stay") or exits at once ("exit").
TREE = f"""\
import os, signal, subprocess, sys
stubborn = ["sh", "-c", 'trap "" {IGNORED}; exec sleep 300']
in_group = subprocess.Popen(stubborn)
own_session = subprocess.Popen(stubborn, start_new_session=True)
r, w = os.pipe()
middle = os.fork()
if middle == 0:
    grandchild = os.fork()
    if grandchild == 0:
        os.setsid()
        os.execvp("sh", stubborn)
    os.write(w, str(grandchild).encode())
    os._exit(0)
os.close(w)
os.waitpid(middle, 0)
double = int(os.read(r, 64))
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(f"{{os.getpid()}} {{in_group.pid}} {{own_session.pid}} {{double}}\\n")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
if sys.argv[2] == "exit":
    sys.exit(0)
in_group.wait()
"""

#: The next leader's CMD: writes the live processes (not zombies, or zombie main threads with live threads)
#: carrying marker argv[2] to argv[1] at once, leaving out the pids given after it (the old supervisor, which
#: may still be on its way out).
SURVIVORS = f"""\
import os, sys
out, token, ignore = sys.argv[1], sys.argv[2].encode(), set(sys.argv[3:])
needle, alive = b"\\0{MARKER}=" + token + b"\\0", []
for entry in os.listdir("/proc"):
    if not entry.isdigit() or entry in ignore or int(entry) == os.getpid():
        continue
    try:
        with open(f"/proc/{{entry}}/environ", "rb") as fh:
            env = b"\\0" + fh.read()
        with open(f"/proc/{{entry}}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        for task in os.listdir(f"/proc/{{entry}}/task") if state == "Z" else ():  # a main thread ended alone
            with open(f"/proc/{{entry}}/task/{{task}}/stat") as fh:
                state = "Z+" if fh.read().rsplit(")", 1)[1].split()[0] not in "ZX" else state
    except OSError:
        continue
    if needle in env and state != "Z":
        alive.append(entry)
with open(out, "w") as fh:
    fh.write(" ".join(alive) + "\\n")
"""


def marked(token: str) -> list[int]:
    """Live processes (a zombie main thread with a live thread included) whose environment carries ``MARKER=token``."""
    needle = f"\0{MARKER}={token}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = b"\0" + fh.read()
            state = state_of(int(entry))
        except OSError:
            continue
        if needle in env and state not in ("Z", "gone"):
            found.append(int(entry))
    return found


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """Keep ``pid`` stopped in a ptrace stop (which, unlike SIGSTOP, the SIGCONT the kernel sends to an
    orphaned process group does not end), then let it go."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(_PTRACE_SEIZE, pid, None, None) != 0:
        pytest.skip(f"ptrace not permitted here: {os.strerror(ctypes.get_errno())}")
    try:
        assert libc.ptrace(_PTRACE_INTERRUPT, pid, None, None) == 0, os.strerror(ctypes.get_errno())
        os.waitpid(pid, _WALL)
        yield
    finally:
        libc.ptrace(_PTRACE_DETACH, pid, None, None)


_PTRACE_DETACH, _PTRACE_SEIZE, _PTRACE_INTERRUPT, _WALL = 17, 0x4206, 0x4207, 0x40000000


@pytest.fixture
def token() -> Iterator[str]:
    """The marker of one test's CMD tree; whatever carries it is SIGKILLed at teardown."""
    value = secrets.token_hex(6)
    try:
        yield value
    finally:
        for _ in range(3):
            for pid in marked(value):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)


@pytest.fixture
def scripts(tmp_path: Path) -> tuple[Path, Path]:
    tree, survivors = tmp_path / "tree.py", tmp_path / "survivors.py"
    tree.write_text(TREE)
    survivors.write_text(SURVIVORS)
    return tree, survivors


def start_tree(
    spawner: Spawner, backend: list[str], tree: Path, out: Path, token: str, mode: str = "stay"
) -> tuple[subprocess.Popen[str], list[int]]:
    """``aioelect run BACKEND -- python tree.py``; the supervisor and the tree's pids once it is up."""
    proc = spawner.start("run", *backend, "--grace", "0.5", "--", sys.executable, str(tree), str(out), mode,
                         **{MARKER: token})  # fmt: skip
    wait_until("CMD's tree to start", out.exists, 30)
    pids = [int(pid) for pid in out.read_text().split()]
    assert len(pids) == 4
    return proc, pids


def next_leader_sees(backend: list[str], survivors: Path, out: Path, token: str, *ignore: int) -> list[str]:
    """Run the next leader; the processes of the old tree alive when its CMD started."""
    result = cli("run", *backend, "--", sys.executable, str(survivors), str(out), token, *map(str, ignore))
    assert result.returncode == 0, f"the next leader did not run its CMD: {result.stderr}"
    return out.read_text().split()


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGKILL,
    ],
    ids=lambda s: signal.Signals(s).name,
)
def test_no_process_of_cmds_tree_outlives_the_supervisor_killed_by(
    sig: signal.Signals, spawner: Spawner, scripts: tuple[Path, Path], token: str, tmp_path: Path
) -> None:
    tree, survivors = scripts
    backend = ["--file", str(tmp_path / "leader.lock")]
    proc, pids = start_tree(spawner, backend, tree, tmp_path / "tree-pids", token)
    proc.send_signal(sig)
    status = spawner.wait(proc, timeout=20)
    alive = next_leader_sees([*backend, "--no-wait"], survivors, tmp_path / "seen", token, proc.pid)
    assert alive == [], f"after {sig.name} of the supervisor, CMD's tree {pids} still had {alive} alive"
    if sig != signal.SIGKILL:  # forwarded; CMD dies of it and gives the status
        assert status == 128 + sig, spawner.stderr(proc)


@pytest.mark.parametrize("kind", ["file", "mysql", "postgres"])
def test_the_lock_of_a_sigkilled_supervisor_passes_on_only_once_cmds_tree_is_gone(
    kind: str, request: pytest.FixtureRequest, spawner: Spawner, scripts: tuple[Path, Path], token: str, tmp_path: Path
) -> None:
    # The shim between aioelect and CMD holds the lock file / the server session's socket until it has killed
    # the tree. Frozen (SIGSTOP) while the supervisor is SIGKILLed, it shows that: the lock stays taken until
    # it runs again, and the next leader then finds nothing of the tree alive.
    tree, survivors = scripts
    if kind in ("mysql", "postgres"):
        dsn = request.getfixturevalue(f"{kind}_dsn")
        backend = [f"--{kind}", dsn, "--name", f"tree-{secrets.token_hex(4)}", "--poll-interval", "0.1"]
    else:
        backend = ["--file", str(tmp_path / "leader.lock")]
    proc, pids = start_tree(spawner, backend, tree, tmp_path / "tree-pids", token)
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as fh:
        (shim,) = map(int, fh.read().split())
    with frozen(shim):
        proc.kill()
        proc.wait(10)
        held = cli("run", *backend, "--no-wait", "--", "true")
        assert held.returncode == 75, f"the lock passed on while CMD's tree lived: {held.stderr}"
        assert set(pids) <= set(marked(token))
    alive = next_leader_sees(backend, survivors, tmp_path / "seen", token)
    assert alive == [], f"CMD's tree {pids} still had {alive} alive when the next leader started"


def test_on_etcd_cmds_tree_is_gone_long_before_the_lease_of_a_sigkilled_supervisor_expires(
    etcd_endpoints: list[str], spawner: Spawner, scripts: tuple[Path, Path], token: str, tmp_path: Path
) -> None:
    # etcd keeps a SIGKILLed supervisor's lease until ttl after its last keep-alive, whatever the shim does:
    # the next leader waits for that, and by then the shim must long have ended the whole tree.
    ttl = 3  # the shortest ttl whose margin (1 s) leaves room for start_tree's --grace 0.5
    tree, survivors = scripts
    backend = ["--etcd", ",".join(etcd_endpoints), "--name", f"/tree-{secrets.token_hex(4)}", "--ttl", str(ttl)]
    proc, pids = start_tree(spawner, backend, tree, tmp_path / "tree-pids", token)
    killed_at = time.time()
    proc.kill()
    proc.wait(10)
    gone = wait_until("CMD's tree to die with the shim", lambda: not marked(token), ttl)
    seen = tmp_path / "seen"
    alive = next_leader_sees(backend, survivors, seen, token)
    next_cmd = seen.stat().st_mtime - killed_at
    print(f"MEASURED etcd SIGKILLed supervisor: tree gone {gone:.3f}s after, next leader's CMD at {next_cmd:.2f}s")
    assert alive == [], f"CMD's tree {pids} still had {alive} alive when the next leader started"
    # Well before the lease could pass on: within the 1 s margin a cut-off leader keeps for its CMD.
    assert gone < 1.0, f"CMD's tree outlived the SIGKILLed supervisor by {gone:.2f}s"
    assert next_cmd > gone


@pytest.mark.parametrize("ending", ["cmd-exits", "sigterm", "shim-killed"])
def test_setsid_and_double_forked_descendants_are_ended_before_the_release(
    ending: str, spawner: Spawner, scripts: tuple[Path, Path], token: str, tmp_path: Path
) -> None:
    # shim-killed: the process between aioelect and CMD is SIGKILLed; CMD dies with it, and aioelect (a child
    # subreaper too) ends the rest of the tree before the release.
    tree, survivors = scripts
    backend = ["--file", str(tmp_path / "leader.lock")]
    mode = "exit" if ending == "cmd-exits" else "stay"
    proc, _ = start_tree(spawner, backend, tree, tmp_path / "tree-pids", token, mode=mode)
    if ending == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif ending == "shim-killed":
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as fh:
            (shim,) = map(int, fh.read().split())
        os.kill(shim, signal.SIGKILL)
    status = spawner.wait(proc, timeout=20)
    expected = {"cmd-exits": 0, "sigterm": 128 + signal.SIGTERM, "shim-killed": 128 + signal.SIGKILL}
    assert status == expected[ending], spawner.stderr(proc)
    assert marked(token) == [], "a descendant of CMD outlived aioelect run"
    alive = next_leader_sees([*backend, "--no-wait"], survivors, tmp_path / "seen", token)
    assert alive == []
    if ending == "cmd-exits":
        assert "still running" in spawner.stderr(proc), spawner.stderr(proc)
    if ending == "shim-killed":
        assert "the process shim (pid" in spawner.stderr(proc), spawner.stderr(proc)


#: CMD as aioelect runs it as PID 1: leaves argv[3] orphans of its own (double forks whose middle exits at once),
#: writes argv[1] + ".ready", waits for argv[1] + ".go", lets every orphan end, then writes the number of zombies
#: in the PID namespace to argv[1].
ORPHANS = """\
import os, sys, time
for _ in range(int(sys.argv[2])):
    middle = os.fork()
    if middle == 0:
        if os.fork() == 0:
            time.sleep(0.05)
            os._exit(0)
        os._exit(0)
    os.waitpid(middle, 0)
open(sys.argv[1] + ".ready", "w").close()
deadline = time.monotonic() + 30
while not os.path.exists(sys.argv[1] + ".go") and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(1.5)
zombies = 0
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/stat") as fh:
                zombies += fh.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            pass
with open(sys.argv[1], "w") as fh:
    fh.write(f"{zombies}\\n")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0, reason="needs Linux and root")
def test_as_pid_1_orphans_are_reaped(tmp_path: Path) -> None:
    # Orphans of CMD's tree (reaped by the shim) and orphans of a process that entered the PID namespace from
    # outside, as `kubectl exec` does (the kernel hands them to PID 1: aioelect).
    script, out = tmp_path / "orphans.py", tmp_path / "zombies"
    script.write_text(ORPHANS)
    run = aioelect_argv(
        "run", "--file", str(tmp_path / "leader.lock"), "--", sys.executable, str(script), str(out), "30"
    )
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *run]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    try:
        wait_until("CMD's orphans", Path(f"{out}.ready").exists, 30)
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as fh:
            (pid_1,) = map(int, fh.read().split())  # aioelect, PID 1 in the namespace
        entered = [
            "nsenter",
            "-t",
            str(pid_1),
            "-p",
            "-m",
            "--",
            "sh",
            "-c",
            "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.01 & done",
        ]
        subprocess.run(entered, check=True, timeout=30)
        Path(f"{out}.go").touch()
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == 0, stderr
    assert out.read_text().split() == ["0"], f"zombies in the PID namespace: {out.read_text()}"


# --- a CMD that stops its shim, stops or hides its workers: the lock still waits for the whole tree ---------

#: CMD: with no argv[1] yet, starts a tree (MODE argv[2]), writes its pids to argv[1], stops its shim (its
#: parent) and runs on (or exits, MODE "cmd-exits"); a later run (--forever), MODE "scan", or a run as identity
#: "successor" appends to argv[3] the live processes carrying the marker, leaving out itself, its shim and the
#: supervisors (which carry the marker too).
STOPPER = f"""\
import os, signal, subprocess, sys, time
out, mode, seen = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "scan" or os.path.exists(out) or os.environ.get("AIOELECT_IDENTITY") == "successor":
    ignore = {{str(os.getpid()), str(os.getppid())}}
    needle, alive = b"\\0{MARKER}=" + os.environ["{MARKER}"].encode() + b"\\0", []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry in ignore:
            continue
        try:
            with open(f"/proc/{{entry}}/environ", "rb") as fh:
                env = b"\\0" + fh.read()
            with open(f"/proc/{{entry}}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            for task in os.listdir(f"/proc/{{entry}}/task") if state == "Z" else ():  # a main thread ended alone
                with open(f"/proc/{{entry}}/task/{{task}}/stat") as fh:
                    state = "Z+" if fh.read().rsplit(")", 1)[1].split()[0] not in "ZX" else state
            with open(f"/proc/{{entry}}/cmdline", "rb") as fh:
                supervisor = b"\\0-m\\0aioelect\\0" in fh.read()
        except OSError:
            continue
        if needle in env and state != "Z" and not supervisor:
            alive.append(f"{{entry}}:{{state}}")
    with open(seen, "a") as fh:
        fh.write("[" + " ".join(alive) + "]\\n")
    sys.exit(0)
stubborn = ["sh", "-c", 'trap "" {IGNORED}; exec sleep 300']
worker = subprocess.Popen(stubborn, start_new_session=True)
pids = [os.getpid(), os.getppid(), worker.pid]
if mode == "double-fork":
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        grandchild = os.fork()
        if grandchild == 0:
            os.setsid()
            os.execvp("sh", stubborn)
        os.write(w, str(grandchild).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(middle, 0)
    pids.append(int(os.read(r, 64)))
time.sleep(0.2)  # the worker has exec'd sleep, which ignores SIGTERM
if mode == "stopped-worker":
    os.kill(worker.pid, signal.SIGSTOP)
if mode == "cgroup-escape":  # root may move a process out of its cgroup: into the parent of CMD's
    with open("/proc/self/cgroup") as fh:
        mine = next(line[3:].strip() for line in fh if line.startswith("0::"))
    with open("/proc/self/mountinfo") as fh:
        mount = next(f[4] for f in map(str.split, fh) if f[f.index("-") + 1] == "cgroup2")
    try:
        with open(os.path.join(mount + os.path.dirname(mine), "cgroup.procs"), "w") as fh:
            fh.write(str(worker.pid))
    except OSError:
        pass  # no cgroup of its own (read-only cgroup v2): nothing to escape
with open(out + ".tmp", "w") as fh:
    fh.write(" ".join(map(str, pids)) + "\\n")
os.replace(out + ".tmp", out)
if mode != "traced-worker":
    os.kill(os.getppid(), signal.SIGSTOP)  # the shim
if mode == "cmd-exits":
    sys.exit(0)
while True:
    time.sleep(1)
"""


@contextlib.contextmanager
def traced(pid: int) -> Iterator[None]:
    """Keep ``pid`` in a ptrace stop (traced by this test) until the end of the block, then reap or detach it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(_PTRACE_SEIZE, pid, None, None) != 0:
        pytest.skip(f"ptrace not permitted here: {os.strerror(ctypes.get_errno())}")
    try:
        assert libc.ptrace(_PTRACE_INTERRUPT, pid, None, None) == 0, os.strerror(ctypes.get_errno())
        os.waitpid(pid, _WALL)
        yield
    finally:
        libc.ptrace(_PTRACE_DETACH, pid, None, None)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG | _WALL)  # killed while traced: its zombie is the tracer's to reap


def replace_lock_file(path: Path) -> None:
    """The file backend's loss: the lock file is replaced (the next campaign locks the new one)."""
    new = path.with_name(path.name + ".new")
    new.write_text("")
    os.replace(new, path)


def scans(seen: Path) -> list[str]:
    return seen.read_text().splitlines() if seen.exists() else []


def state_of(pid: int) -> str:
    """``pid``'s state in /proc; ``Z+`` for a zombie main thread whose other threads run; ``gone``."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        for task in os.listdir(f"/proc/{pid}/task") if state == "Z" else ():
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    return "Z+"
        return state
    except OSError:
        return "gone"


def cgroup2_mount() -> str | None:
    """Where cgroup v2 is mounted here (None if nowhere)."""
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            if fields[fields.index("-") + 1] == "cgroup2":
                return fields[4]
    return None


def start_contained(spawner: Spawner, containment: str, *args: str, **env: str) -> subprocess.Popen[str]:
    """``aioelect ARGS``; for "subreaper", in a mount namespace of its own where cgroup v2 is read-only."""
    if containment == "cgroup":
        return spawner.start(*args, **env)
    mount = cgroup2_mount()
    if mount is None or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup v2 mount to take away")
    n = len(spawner.procs)
    script = 'mount -o remount,bind,ro "$0" && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, mount, *aioelect_argv(*args)]
    proc = subprocess.Popen(
        argv,
        stdout=open(spawner.tmp / f"proc{n}.out", "w"),  # noqa: SIM115 - closed with the process
        stderr=open(spawner.tmp / f"proc{n}.err", "w"),  # noqa: SIM115
        text=True,
        env=_env(**env),
        cwd=ROOT,
    )
    spawner.procs.append(proc)
    return proc


@pytest.mark.parametrize("containment", ["cgroup", "subreaper"])
@pytest.mark.parametrize(
    "mode", ["setsid", "cmd-exits", "stopped-worker", "double-fork", "traced-worker", "cgroup-escape"]
)
def test_a_cmd_that_stops_its_shim_is_gone_before_the_next_leaders_cmd_starts(
    mode: str, containment: str, spawner: Spawner, token: str, tmp_path: Path
) -> None:
    # --forever: after the loss the same supervisor releases, campaigns again and runs CMD again, which then
    # looks for the first tree's processes. Without --forever the first tree lived as long as aioelect did.
    script, out, seen, lock = tmp_path / "stopper.py", tmp_path / "tree-pids", tmp_path / "seen", tmp_path / "lock"
    script.write_text(STOPPER)
    proc = start_contained(spawner, containment, "run", "--file", str(lock), "--check-interval", "0.05",
                           "--grace", "0.5", "--forever", "--restart-delay", "0.1",
                           "--", sys.executable, str(script), str(out), mode, str(seen), **{MARKER: token})  # fmt: skip
    wait_until("CMD's tree to start", out.exists, 30)
    cmd, shim, *workers = map(int, out.read_text().split())
    tracing = traced(workers[0]) if mode == "traced-worker" else contextlib.nullcontext()
    with tracing:
        if mode not in ("traced-worker", "cmd-exits"):  # CMD's exit under a stopped shim is seen without a loss
            wait_until("CMD to stop its shim", lambda: state_of(shim) == "T", 10)
        states = {pid: state_of(pid) for pid in (cmd, shim, *workers)}
        if mode == "cgroup-escape" and containment == "cgroup":
            assert Path(f"/proc/{workers[0]}/cgroup").read_text() != Path(f"/proc/{shim}/cgroup").read_text()
        replace_lock_file(lock)
        took = wait_until("the next leader's CMD", lambda: bool(scans(seen)), 30)
    print(f"MEASURED {mode} ({containment}): the next leader's CMD {took:.2f}s after the loss (grace 0.5s)")
    assert scans(seen)[0] == "[]", f"the tree {states} still had {scans(seen)[0]} alive when the next CMD started"
    stderr = spawner.stderr(proc)
    assert "CMD was killed" not in stderr, stderr
    expected = "in a cgroup v2 of its own" if containment == "cgroup" else "no writable cgroup"
    assert expected in stderr, stderr
    for pid in workers:
        assert str(pid) in stderr, f"the log does not say what was killed ({pid}):\n{stderr}"
    proc.send_signal(signal.SIGTERM)
    spawner.wait(proc, timeout=20)


def test_a_cmd_that_stops_its_shim_is_gone_before_a_cut_off_leaders_successor_starts(
    mariadb: MariaDBServer,
    tcp_proxy_factory: Callable[[str, int], TCPProxy],
    spawner: Spawner,
    token: str,
    tmp_path: Path,
) -> None:
    # MySQL --lease 5: the cut-off leader learns of its loss 1.5 s before the server lets the lock go.
    proxy = tcp_proxy_factory("127.0.0.1", mariadb.port)
    name = f"stopper-{secrets.token_hex(4)}"
    dsn = f"mysql://root@127.0.0.1:{{}}/{mariadb.database}"
    script, out, seen = tmp_path / "stopper.py", tmp_path / "tree-pids", tmp_path / "seen"
    script.write_text(STOPPER)
    argv = [sys.executable, str(script), str(out), "setsid", str(seen)]
    leader = spawner.start("run", "--mysql", dsn.format(proxy.port), "--lease", "5", "--name", name,
                           "--forever", "--restart-delay", "60", "--", *argv, **{MARKER: token})  # fmt: skip
    wait_until("CMD's tree to start", out.exists, 30)
    wait_until("CMD to stop its shim", lambda: state_of(int(out.read_text().split()[1])) == "T", 10)
    successor = spawner.start("run", "--mysql", dsn.format(mariadb.port), "--lease", "5", "--name", name,
                              "--poll-interval", "0.1", "--identity", "successor", "--", *argv,
                              **{MARKER: token})  # fmt: skip
    time.sleep(1.0)
    assert not scans(seen), "the successor ran while the leader held the lock"
    tree = [int(pid) for pid in out.read_text().split()]
    proxy.stall()
    gone = wait_until("the tree to be gone", lambda: all(state_of(pid) in ("gone", "Z") for pid in tree), 30)
    successor_at = gone + wait_until("the successor's CMD", lambda: bool(scans(seen)), 30)
    print(f"MEASURED stopped shim, MySQL lease 5: tree gone {gone:.2f}s after the cut, successor {successor_at:.2f}s")
    assert scans(seen) == ["[]"], f"the cut-off leader's tree still had {scans(seen)} alive"
    assert spawner.wait(successor, timeout=20) == 0
    assert "leadership lost" in spawner.stderr(leader), spawner.stderr(leader)


@pytest.mark.timeout(120)
def test_every_shards_cmd_that_stops_its_shim_is_gone_before_its_name_passes_on(
    etcd: EtcdServer,
    tcp_proxy_factory: Callable[[str, int], TCPProxy],
    spawner: Spawner,
    token: str,
    tmp_path: Path,
) -> None:
    proxy = tcp_proxy_factory("127.0.0.1", etcd.port)
    group = f"stopper-{secrets.token_hex(3)}"
    script, out, seen = tmp_path / "stopper.py", tmp_path / "tree-pids", tmp_path / "seen"
    script.write_text(STOPPER)
    argv = [sys.executable, str(script), str(out), "setsid", str(seen)]
    first = spawner.start("shards", "--etcd", proxy.endpoint, "--ttl", "3", "--name", group, "--names", "a",
                          "--identity", "first", "--restart-delay", "60", "--", *argv, **{MARKER: token})  # fmt: skip
    wait_until("CMD's tree to start", out.exists, 30)
    wait_until("CMD to stop its shim", lambda: state_of(int(out.read_text().split()[1])) == "T", 10)
    spawner.start("shards", "--etcd", etcd.endpoint, "--ttl", "3", "--name", group, "--names", "a",
                  "--identity", "successor", "--restart-delay", "60", "--", *argv, **{MARKER: token})  # fmt: skip
    time.sleep(1.0)
    proxy.stall()  # whether the name moved to the successor on its own or not, the cut-off ends it
    wait_until("the successor's CMD", lambda: bool(scans(seen)), 60)
    assert scans(seen) == ["[]"], f"the first owner's tree still had {scans(seen)} alive"
    assert "stopping CMD" in spawner.stderr(first), spawner.stderr(first)


# --- CMD's own exit status ----------------------------------------------------------------------------------

#: CMD: on SIGTERM, restores its default (a second SIGTERM would kill it), cleans up a moment, exits 3.
TRAP_EXIT_3 = """\
trap 'trap - TERM; sleep 0.05; exit 3' TERM
touch "$1"
while :; do sleep 0.1; done
"""


def test_after_a_loss_the_exit_status_is_cmds_own(spawner: Spawner, tmp_path: Path) -> None:
    script, lock = tmp_path / "trap.sh", tmp_path / "lock"
    script.write_text(TRAP_EXIT_3)
    statuses, logged = [], []
    for attempt in range(6):  # each process got SIGTERM twice: the second often killed CMD in its trap
        ready = tmp_path / f"ready-{attempt}"
        proc = spawner.start("run", "--file", str(lock), "--check-interval", "0.05", "--grace", "5",
                             "--", "sh", str(script), str(ready))  # fmt: skip
        wait_until("CMD to start", ready.exists, 30)
        time.sleep(0.1)
        replace_lock_file(lock)
        statuses.append(spawner.wait(proc, timeout=20))
        logged.append("CMD exited with status 3" in spawner.stderr(proc))
    assert statuses == [3] * 6, statuses
    assert all(logged)


@pytest.mark.parametrize("containment", ["cgroup", "subreaper"])
def test_cmd_exiting_under_a_stopped_shim_is_seen_and_its_tree_ended(
    containment: str, spawner: Spawner, token: str, tmp_path: Path
) -> None:
    # No loss: CMD stops its shim, which then cannot report CMD's exit; aioelect sees it all the same, ends the
    # rest of the tree and exits with CMD's status.
    script, out, seen = tmp_path / "stopper.py", tmp_path / "tree-pids", tmp_path / "seen"
    script.write_text(STOPPER)
    proc = start_contained(spawner, containment, "run", "--file", str(tmp_path / "lock"), "--grace", "0.5",
                           "--", sys.executable, str(script), str(out), "cmd-exits", str(seen),
                           **{MARKER: token})  # fmt: skip
    wait_until("CMD's tree to start", out.exists, 30)
    status = spawner.wait(proc, timeout=20)
    assert status == 0, spawner.stderr(proc)
    assert marked(token) == [], "a process of CMD's tree outlived aioelect run"
    assert "is stopped" in spawner.stderr(proc), spawner.stderr(proc)


# --- a process that hides: a zombie main thread with a live thread, a pid that changes all the time ----------

#: CMD: the first run starts, double-forked in a session of its own, a "ghost" (its main thread ends with
#: SYS_exit, so /proc/PID/stat says Z, while a second thread appends "PID TIME" to argv[1] every 50 ms and ends
#: it all after 15 s; it ignores every catchable signal), or executes argv[4], the racer; then sleeps. A later
#: run (the next leader's) writes its start time to argv[3] and exits.
HIDER = """\
import ctypes, os, signal, sys, threading, time
beat, mode, report = sys.argv[1], sys.argv[2], sys.argv[3]
if os.path.exists(beat + ".started"):
    with open(report, "w") as fh:
        fh.write(f"{time.time():.6f}\\n")
    sys.exit(0)
open(beat + ".started", "w").close()
if os.fork() == 0:
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    if mode == "racer":
        os.execv(sys.argv[4], [sys.argv[4], beat])
    end = time.time() + 15
    def write():
        with open(beat, "a") as fh:
            fh.write(f"{os.getpid()} {time.time():.6f}\\n")
    if mode == "ghost":
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)  # only SIGKILL ends it
        def run():
            while time.time() < end:
                write()
                time.sleep(0.05)
            os._exit(0)
        threading.Thread(target=run).start()
        time.sleep(0.1)
        ctypes.CDLL(None).syscall(60, 0)  # SYS_exit (x86_64): this thread only
while True:
    time.sleep(1)
"""


#: The racer in C (a Python fork is too slow to hide): double-forked in a session of its own, forks and exits
#: again and again, so every pid lives microseconds; appends "PID TIME" to argv[1] every 50 ms, ends after 15 s.
RACER = r"""
#include <stdio.h>
#include <sys/time.h>
#include <unistd.h>
static double now(void) { struct timeval t; gettimeofday(&t, 0); return t.tv_sec + t.tv_usec / 1e6; }
int main(int argc, char **argv) {
    if (argc < 2 || fork() != 0) return 0;
    setsid();
    if (fork() != 0) _exit(0);
    double start = now(), last = 0;
    for (;;) {
        double t = now();
        if (t - start > 15) _exit(0);
        if (t - last > 0.05) {
            FILE *f = fopen(argv[1], "a");
            if (f) { fprintf(f, "%d %.6f\n", getpid(), t); fclose(f); }
            last = t;
        }
        pid_t c = fork();
        if (c < 0) { usleep(1000); continue; }
        if (c > 0) _exit(0);
    }
}
"""


def hider(tmp_path: Path, mode: str) -> list[str]:
    """The argv of CMD: HIDER, whose first run starts a ghost (Python) or a racer (compiled from RACER)."""
    script = tmp_path / "hider.py"
    script.write_text(HIDER)
    argv = [sys.executable, str(script), str(tmp_path / "beat"), mode, str(tmp_path / "report")]
    if mode == "racer":
        (tmp_path / "racer.c").write_text(RACER)
        built = subprocess.run(["cc", "-O2", "-o", str(tmp_path / "racer"), str(tmp_path / "racer.c")],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert built.returncode == 0, built.stderr
        argv.append(str(tmp_path / "racer"))
    return argv


def beats_after(beat: Path, start: float) -> list[str]:
    return [line for line in beat.read_text().splitlines() if float(line.split()[1]) > start]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="SYS_exit is 60 on x86_64 only")
@pytest.mark.parametrize("containment", ["cgroup", "subreaper"])
@pytest.mark.parametrize("mode", ["ghost", "racer"])
def test_a_hiding_process_of_cmds_tree_is_gone_before_the_next_leaders_cmd_starts(
    mode: str, containment: str, spawner: Spawner, token: str, tmp_path: Path
) -> None:
    beat, report, lock = tmp_path / "beat", tmp_path / "report", tmp_path / "lock"
    proc = start_contained(spawner, containment, "run", "--file", str(lock), "--check-interval", "0.05",
                           "--grace", "0.5", "--forever", "--restart-delay", "0.1",
                           "--", *hider(tmp_path, mode), **{MARKER: token})  # fmt: skip
    wait_until("the hider to beat", lambda: beat.exists() and len(beat.read_text().splitlines()) > 3, 30)
    replace_lock_file(lock)
    took = wait_until("the next leader's CMD", report.exists, 30)
    print(f"MEASURED {mode} ({containment}): the next leader's CMD {took:.2f}s after the loss (grace 0.5s)")
    time.sleep(0.5)
    after = beats_after(beat, float(report.read_text()))
    proc.send_signal(signal.SIGTERM)
    spawner.wait(proc, timeout=30)
    stderr = spawner.stderr(proc)
    assert after == [], f"the {mode} still ran after the next leader's CMD started: {after}\n{stderr}"
    if mode == "ghost":  # it ignores SIGTERM: the log names it among the processes SIGKILLed
        ghost = beat.read_text().split()[0]
        assert f"{ghost} (python" in stderr and "main thread ended" in stderr, stderr


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="SYS_exit is 60 on x86_64 only")
@pytest.mark.parametrize("containment", ["cgroup", "subreaper"])
@pytest.mark.parametrize("mode", ["ghost", "racer"])
def test_a_hiding_process_is_gone_before_the_lock_of_a_sigkilled_supervisor_passes_on(
    mode: str, containment: str, spawner: Spawner, token: str, tmp_path: Path
) -> None:
    beat, report, lock = tmp_path / "beat", tmp_path / "report", tmp_path / "lock"
    argv = ["--", *hider(tmp_path, mode)]
    proc = start_contained(spawner, containment, "run", "--file", str(lock), *argv, **{MARKER: token})
    wait_until("the hider to beat", lambda: beat.exists() and len(beat.read_text().splitlines()) > 3, 30)
    proc.send_signal(signal.SIGKILL)
    spawner.wait(proc, timeout=20)
    deadline = time.monotonic() + 30
    while True:  # the lock passes on once the shim is gone
        result = cli("run", "--file", str(lock), "--no-wait", *argv)
        if result.returncode != 75 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert result.returncode == 0, result.stderr
    time.sleep(0.5)
    after = beats_after(beat, float(report.read_text()))
    assert after == [], f"the {mode} still ran after the next leader's CMD started: {after}"


#: CMD: stops its shim, then ends its main thread only while a second thread runs on for 3 s, then exits 7.
LIAR = """\
import ctypes, os, signal, sys, threading, time
def run():
    time.sleep(3)
    os._exit(7)
threading.Thread(target=run).start()
time.sleep(0.3)
os.kill(os.getppid(), signal.SIGSTOP)
time.sleep(0.2)
ctypes.CDLL(None).syscall(60, 0)  # SYS_exit (x86_64): this thread only
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="SYS_exit is 60 on x86_64 only")
@pytest.mark.parametrize("containment", ["cgroup", "subreaper"])
def test_a_cmd_whose_main_thread_ended_is_not_taken_for_exited(
    containment: str, spawner: Spawner, token: str, tmp_path: Path
) -> None:
    script = tmp_path / "liar.py"
    script.write_text(LIAR)
    started = time.monotonic()
    proc = start_contained(spawner, containment, "run", "--file", str(tmp_path / "lock"),
                           "--", sys.executable, str(script), **{MARKER: token})  # fmt: skip
    status = spawner.wait(proc, timeout=30)
    took = time.monotonic() - started
    assert (status, "CMD exited with status 7" in spawner.stderr(proc)) == (7, True), spawner.stderr(proc)
    assert took > 3, f"aioelect ended {took:.2f}s after it started, while CMD's thread still ran"


@contextlib.contextmanager
def uninterruptible(pid: int, where: Path) -> Iterator[Callable[[], None]]:
    """Hold ``pid`` in uninterruptible sleep (D), which SIGKILL does not end, in a cgroup v1 freezer (a v2
    cgroup's frozen processes die of SIGKILL); yield what wakes it. It is woken, and the mount removed, at the
    end whatever happened."""
    mount = where / "freezer"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "cgroup", "-o", "freezer", "aioelect-test", str(mount)],
                       check=True, timeout=10, capture_output=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"cannot mount a cgroup v1 freezer (root and CONFIG_CGROUP_FREEZER needed): {exc}")
    group = mount / f"aioelect-{secrets.token_hex(4)}"

    def wake() -> None:
        (group / "freezer.state").write_text("THAWED")

    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(pid))
        (group / "freezer.state").write_text("FROZEN")
        wait_until("the process to freeze", lambda: state_of(pid) == "D", 10)
        yield wake
    finally:
        if group.exists():
            wake()
            with contextlib.suppress(OSError):
                wait_until("the frozen cgroup to empty", lambda: not (group / "cgroup.procs").read_text(), 10)
                group.rmdir()
        subprocess.run(["umount", str(mount)], timeout=10, capture_output=True)


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_a_process_in_uninterruptible_sleep_keeps_the_lock_until_it_ends_but_not_a_lease(
    kind: str,
    request: pytest.FixtureRequest,
    tcp_proxy_factory: Callable[[str, int], TCPProxy],
    spawner: Spawner,
    scripts: tuple[Path, Path],
    token: str,
    tmp_path: Path,
) -> None:
    # A process of CMD's tree that SIGKILL cannot end yet. The file lock, which has no lease, is kept, SIGKILL
    # repeated and an error logged every 2 s until the process wakes and dies. A Redis lease is the server's:
    # the cut-off leader keeps killing, but the key expires and a successor's CMD starts beside the process.
    tree, survivors = scripts
    if kind == "file":
        backend = successor = ["--file", str(tmp_path / "leader.lock")]
    else:
        server = request.getfixturevalue("fresh_redis")
        proxy = tcp_proxy_factory(server.host, server.port)
        name = ["--name", f"stuck-{secrets.token_hex(4)}", "--lease", "4", "--renew-deadline", "2.5"]
        backend = ["--redis", server.url.replace(f":{server.port}/", f":{proxy.port}/"), *name]
        successor = ["--redis", server.url, *name]
    proc, pids = start_tree(spawner, backend, tree, tmp_path / "tree-pids", token)
    stuck = pids[1]
    with uninterruptible(stuck, tmp_path) as wake:
        if kind == "file":
            proc.send_signal(signal.SIGTERM)
        else:
            proxy.stall()
        wait_until("the error that a process survived SIGKILL", lambda: "survived SIGKILL" in spawner.stderr(proc), 20)
        time.sleep(2.5)
        errors = spawner.stderr(proc).count("survived SIGKILL")
        assert proc.poll() is None, "aioelect ended while a process of CMD's tree lived"
        left = set(marked(token)) - {proc.pid}
        assert left == {stuck}, f"SIGKILL left more of CMD's tree {pids} than the process that cannot die: {left}"
        assert errors >= 2, f"one error every 2 s while it lives, {errors} seen:\n{spawner.stderr(proc)}"
        if kind == "file":
            held = cli("run", *successor, "--no-wait", "--", "true")
            assert held.returncode == 75, f"the lock passed on while CMD's tree lived: {held.stderr}"
        else:
            seen = next_leader_sees(successor, survivors, tmp_path / "seen", token, proc.pid)
            assert seen == [str(stuck)], f"the successor's CMD started and saw {seen} of the old tree alive"
        wake()
        status = spawner.wait(proc, timeout=20)
    assert state_of(stuck) == "gone"
    if kind == "file":
        assert status == 128 + signal.SIGTERM, spawner.stderr(proc)
        alive = next_leader_sees([*successor, "--no-wait"], survivors, tmp_path / "seen", token)
        assert alive == [], f"CMD's tree {pids} still had {alive} alive when the next leader started"


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0, reason="needs Linux and root")
def test_as_pid_1_a_sigterm_during_startup_stops_it_before_cmd_starts(tmp_path: Path) -> None:
    # The kernel drops a signal sent to a PID namespace's init while it has no handler for it (its default
    # action is ignored for PID 1). aioelect installs its handlers only once its command runs, after its imports
    # and the backend's configuration: a SIGTERM sent meanwhile (a container stopped as it starts) was lost,
    # and aioelect campaigned, led and ran CMD to its end as if never asked to stop.
    marker = tmp_path / "cmd-ran"
    run = aioelect_argv("run", "--file", str(tmp_path / "leader.lock"), "--",
                        "sh", "-c", f"touch {marker}; sleep 20")  # fmt: skip
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *run]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    try:
        pid_1 = None
        deadline = time.monotonic() + 10
        while pid_1 is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError), open(f"/proc/{proc.pid}/task/{proc.pid}/children") as fh:
                (pid_1,) = map(int, fh.read().split())
        assert pid_1 is not None, "unshare started no child"
        time.sleep(0.1)  # aioelect, PID 1 in the namespace, is starting (importing, reading its settings)
        os.kill(pid_1, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=15)
    finally:
        proc.kill()
        proc.wait(10)
    assert not marker.exists(), f"CMD started after aioelect was sent SIGTERM:\n{stderr}"
    assert proc.returncode == 128 + signal.SIGTERM, stderr
