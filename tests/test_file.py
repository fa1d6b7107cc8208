"""The single-host ``flock`` backend: real files, real processes.

Candidate processes run tests/candidates/file_candidate.py and report JSON
events with ``time.monotonic()`` (system-wide on Linux), so their leadership
intervals can be compared with each other and with the test process.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import fcntl
import itertools
import json
import logging
import os
import random
import select
import shutil
import signal
import stat
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelect import ElectionError, FileElector, Leadership, LeadershipLost, LossKind, PermanentBackendError, leadership
from aioelect.backends import file as file_backend
from aioelect.backends.file import _inotify as file_inotify
from soak.checker import NS, Term

from .backends import handover_delays
from .faults import EventProcess, judge_terms

CANDIDATE = Path(__file__).parent / "candidates" / "file_candidate.py"


class Proc(EventProcess):
    """One file_candidate.py process."""

    def __init__(self, path: Path, identity: str, *, rounds: int = 1, hold: float = 3600, **options: object) -> None:
        args = [f"--path={path}", f"--identity={identity}", f"--rounds={rounds}", f"--hold={hold}"]
        args += [f"--{option.replace('_', '-')}={value}" for option, value in options.items()]
        super().__init__(CANDIDATE, *args)

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]

    async def wait_for(self, event: str, timeout: float = 15.0) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while not (found := self.named(event)):
                if self.proc.poll() is not None and not self.named(event):
                    await asyncio.sleep(0.1)  # let the reader thread drain stdout
                    if not self.named(event):
                        raise AssertionError(f"candidate exited ({self.proc.returncode}) before {event!r}")
                await asyncio.sleep(0.01)
        return found[0]


async def all_done(procs: list[Proc], timeout: float) -> None:
    """Wait for every process to exit, and require that each succeeded."""
    with anyio.fail_after(timeout):
        while any(p.proc.poll() is None for p in procs):
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)  # let the reader threads drain stdout
    assert all(p.proc.returncode == 0 for p in procs), [p.proc.returncode for p in procs]


def lock_fds(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            continue
    return count


def inotify_fds() -> int:
    """How many inotify instances this process has open."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    return count


needs_inotify = pytest.mark.skipif(file_inotify.libc is None, reason="inotify is Linux-only")


@pytest.fixture
def locked_at(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[float]]:
    """When each identity's campaign took the lock: before the fsynced sidecar write, whose
    duration depends on the disk (other work on this machine can make it tens of ms)."""
    times: dict[str, list[float]] = {}
    record = file_backend.FileBackend._record

    def timed(self: Any, fd: int, identity: str) -> int | None:
        times.setdefault(identity, []).append(time.monotonic())
        return record(self, fd, identity)

    monkeypatch.setattr(file_backend.FileBackend, "_record", timed)
    return times


def make(path: Path, identity: str, **kw: Any) -> FileElector:
    kw.setdefault("check_interval", 0.2)
    return FileElector(path, name="file-test", identity=identity, **kw)


# --- bad input -----------------------------------------------------------------------


def test_bad_input_raises_value_error_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        FileElector(tmp_path / "missing" / "x.lock")
    (tmp_path / "plain").write_text("")
    with pytest.raises(ValueError, match="not a directory"):
        FileElector(tmp_path / "plain" / "x.lock")
    with pytest.raises(ValueError, match="is a directory"):
        FileElector(tmp_path)
    with pytest.raises(ValueError, match="non-empty"):
        FileElector("")
    with pytest.raises(ValueError, match="path"):
        FileElector(42)  # type: ignore[arg-type]
    for bad in (0, -1, float("nan"), "fast"):
        with pytest.raises(ValueError, match="poll_interval"):
            FileElector(tmp_path / "x.lock", poll_interval=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="check_interval"):
        FileElector(tmp_path / "x.lock", check_interval=0)
    with pytest.raises(ValueError, match="name"):
        FileElector(tmp_path / "x.lock", name="has space")
    with pytest.raises(ValueError, match="identity"):
        FileElector(tmp_path / "x.lock", identity="")
    assert not (tmp_path / "x.lock").exists(), "construction must not create anything"


def test_unwritable_or_inaccessible_directory_raises_value_error() -> None:
    base = Path(tempfile.mkdtemp(prefix="aioelect-file-"))
    try:
        base.chmod(0o755)  # /tmp is traversable, so an unprivileged user reaches base
        (base / "ro").mkdir(mode=0o555)
        (base / "ro").chmod(0o555)
        (base / "private").mkdir()
        (base / "private" / "inner").mkdir()
        (base / "private").chmod(0o700)
        cases = {str(base / "ro" / "x.lock"): "not writable", str(base / "private" / "inner" / "x.lock"): "denied"}
        if os.geteuid() != 0:
            for target, expected in cases.items():
                with pytest.raises(ValueError, match=expected):
                    FileElector(target)
            return
        # Root writes anywhere, so construct as an unprivileged user in a forked child (no exec needed).
        for target, expected in cases.items():
            message = _construct_as_nobody(target)
            assert message.startswith("ValueError:") and expected in message, message
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _construct_as_nobody(target: str) -> str:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                FileElector(target)
                message = "no error"
            except ValueError as exc:
                message = f"ValueError: {exc}"
            os.write(write_end, message.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        deadline = time.monotonic() + 10
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            assert time.monotonic() < deadline, "child did not finish"
            time.sleep(0.01)
        return os.read(read_end, 4096).decode()
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


async def test_directory_removed_later_raises_election_error(tmp_path: Path) -> None:
    directory = tmp_path / "gone"
    directory.mkdir()
    elector = make(directory / "x.lock", "a")
    directory.rmdir()
    async with elector:
        with anyio.fail_after(5), pytest.raises(ElectionError, match="No such file"):
            await elector.acquire()
        assert not elector.leading


async def test_corrupt_sidecar_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    (tmp_path / "x.lock.leader").write_text("not json")
    async with make(path, "a") as elector:
        with anyio.fail_after(5), pytest.raises(ElectionError, match="not an aioelect leader file"):
            await elector.acquire()
        assert lock_fds(path) == 0


async def test_leader_waits_for_a_new_holders_record(tmp_path: Path) -> None:
    # A first leader holds the lock a moment before its record exists: leader() (and so
    # observe()) must report it, not a placeholder, once the record is written.
    path = tmp_path / "x.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        async with make(path, "watcher") as watcher, anyio.create_task_group() as tg:
            seen: list[str | None] = []

            async def ask() -> None:
                seen.append(await watcher.leader())

            tg.start_soon(ask)
            await asyncio.sleep(0.1)
            assert seen == []
            (tmp_path / "x.lock.leader").write_text(json.dumps({"identity": "late", "token": 1}))
        assert seen == ["late"]
        # A holder that never writes one (not an aioelect candidate) is reported, after a bound.
        (tmp_path / "x.lock.leader").unlink()
        async with make(path, "watcher") as watcher:
            started = time.monotonic()
            assert await watcher.leader() == f"unknown holder of {path}"
            assert time.monotonic() - started < 2.0
    finally:
        os.close(fd)


# --- contract on one host ------------------------------------------------------------


async def test_acquire_release_tokens_and_sidecar(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    a = make(path, "cand-a")
    async with a, make(path, "watcher") as w:
        assert await w.leader() is None  # no file yet
        tokens = []
        for _ in range(3):
            lead = await a.acquire()
            tokens.append(lead.token)
            assert lead.held
            assert await w.leader() == "cand-a"
            assert await a.leader() == "cand-a"
            with pytest.raises(ElectionError):
                await a.acquire()
            side = json.loads(await anyio.Path(a.sidecar).read_text())
            assert side["identity"] == "cand-a" and side["token"] == lead.token and side["pid"] == os.getpid()
            await lead.release()
            await lead.release()
            assert not lead.held and not lead.lost
            assert await w.leader() is None
        assert tokens == [1, 2, 3]
        assert a.path == str(path) and path.exists(), "the lock file is never deleted"
    assert lock_fds(path) == 0
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")], "no temporary file left behind"


async def test_takeover_after_release_is_fast(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    async with make(path, "a") as a, make(path, "b") as b:
        with anyio.fail_after(30):
            # The other candidate is polling by now; release at a random phase of its polls.
            delays = await handover_delays(a, b, rounds=12, pause=(0.15, 0.25))
    median = statistics.median(delays)
    print(f"file takeover after release: median {median * 1000:.1f} ms, max {max(delays) * 1000:.1f} ms")
    assert median < 0.1, delays


async def test_cancelled_acquire_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    async with make(path, "a") as a, make(path, "b") as b:
        lead = await a.acquire()
        assert lock_fds(path) == 1
        for _ in range(3):
            with anyio.move_on_after(0.15) as scope:
                await b.acquire()
            assert scope.cancelled_caught
            assert not b.leading and lock_fds(path) == 1
            assert lock_fds(Path(str(path) + ".waiting")) == 0
        assert lead.held and await b.leader() == "a"
        await lead.release()
        again = await b.acquire()  # the cancelled elector is reusable
        assert again.token == (lead.token or 0) + 1
        await again.release()
    assert lock_fds(path) == 0
    assert inotify_fds() == 0 and not file_inotify.watchers, "closing the electors closes their inotify instance"


async def test_deleting_the_lock_file_is_a_loss(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    async with make(path, "a", check_interval=0.2) as a:
        with pytest.raises(LeadershipLost, match="deleted or replaced") as info:
            async with leadership(a):
                path.unlink()
                deleted = time.monotonic()
                await asyncio.sleep(10)
        took = time.monotonic() - deleted
        assert took < 0.2 + 1.0, f"loss noticed after {took:.2f}s"
        assert "deleted" in info.value.reason and info.value.kind is LossKind.DEPOSED
        again = await a.acquire()  # a new lock file is created
        assert again.held and path.exists()
        await again.release()


async def test_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    async with make(path, "parent") as a, make(path, "other") as b:
        lead = await a.acquire()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child: outlives the parent's leadership
            time.sleep(3)  # noqa: ASYNC251 - in the forked child, no event loop runs
            os._exit(0)
        try:
            await lead.release()
            with anyio.fail_after(2):
                again = await b.acquire()
            assert again.held
            await again.release()
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # noqa: ASYNC222 - returns at once after SIGKILL


# --- separate processes --------------------------------------------------------------


async def test_crash_takeover_across_processes(tmp_path: Path, procs: list[Proc]) -> None:
    """The kernel's close of a killed holder's file wakes the heir: with a 5 s poll_interval
    (so a 5 s fallback), only the inotify event can make the takeover fast."""
    path = tmp_path / "x.lock"
    took: list[float] = []
    async with make(path, "heir", poll_interval=5.0) as heir:
        for round_ in range(3):
            leader = Proc(path, f"doomed{round_}")
            procs.append(leader)
            first = await leader.wait_for("lead")
            assert await heir.leader() == f"doomed{round_}"
            got: list[float] = []

            async def follow(expected: int, got: list[float]) -> None:
                lead = await heir.acquire()
                got.append(time.monotonic())
                assert lead.token == expected
                await lead.release()

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(follow, first["token"] + 1, got)
                    await asyncio.sleep(0.3)
                    assert not got, "the heir must wait while the other process leads"
                    killed = time.monotonic()
                    leader.proc.kill()
            took.append(got[0] - killed)
    print("file takeover after SIGKILL: " + ", ".join(f"{t * 1000:.1f} ms" for t in took))
    assert max(took) < 1.0, f"takeover after SIGKILL took {took}: the close event was missed"
    assert statistics.median(took) < 0.2, took
    assert inotify_fds() == 0


async def test_mutual_exclusion_across_four_processes(tmp_path: Path, procs: list[Proc]) -> None:
    path = tmp_path / "x.lock"
    marker = tmp_path / "critical"
    rounds = 12
    procs.extend(Proc(path, f"p{i}", rounds=rounds, hold=0.01, marker=marker) for i in range(4))
    await all_done(procs, timeout=60)
    assert not any(p.named("overlap") for p in procs), "two processes were in the critical section at once"
    terms: list[Term] = []
    for i, p in enumerate(procs):
        leads, dones = p.named("lead"), p.named("done")
        assert len(leads) == len(dones) == rounds
        terms += [
            Term(f"p{i}", s["token"], round(s["t"] * NS), round(e["t"] * NS), 1)
            for s, e in zip(leads, dones, strict=True)
        ]
    terms = judge_terms(terms)
    assert [t.token for t in terms] == list(range(1, 4 * rounds + 1)), "tokens must count up by one per leadership"
    assert len({t.who for t in terms}) == 4


async def test_process_takes_over_when_leader_task_is_cancelled(tmp_path: Path, procs: list[Proc]) -> None:
    path = tmp_path / "x.lock"
    async with make(path, "in-test") as a:
        acquired = asyncio.Event()

        async def lead_forever() -> None:
            await a.acquire()
            acquired.set()
            await asyncio.sleep(3600)

        task = asyncio.create_task(lead_forever())
        await acquired.wait()
        follower = Proc(path, "proc")
        procs.append(follower)
        await follower.wait_for("ready")
        await asyncio.sleep(0.3)
        assert not follower.named("lead")
        task.cancel()
        cancelled = time.monotonic()
        lead = await follower.wait_for("lead", timeout=5)
        assert lead["t"] - cancelled < 0.5
        assert await a.leader() == "proc"


async def test_frozen_leader_keeps_the_lock(tmp_path: Path, procs: list[Proc]) -> None:
    """Documented behaviour: flock has no lease, so a stopped leader is not replaced until it dies."""
    path = tmp_path / "x.lock"
    leader = Proc(path, "frozen")
    procs.append(leader)
    await leader.wait_for("lead")
    async with make(path, "heir") as heir:
        leader.proc.send_signal(signal.SIGSTOP)
        try:
            with anyio.move_on_after(0.6) as scope:
                await heir.acquire()
            assert scope.cancelled_caught, "nobody may take a flock from a live (even stopped) process"
            assert await heir.leader() == "frozen"
        finally:
            leader.proc.send_signal(signal.SIGCONT)
        leader.proc.kill()
        with anyio.fail_after(2):
            lead = await heir.acquire()
        await lead.release()


# --- waking followers and handing over -----------------------------------------------


@needs_inotify
async def test_release_wakes_a_waiter_at_once(tmp_path: Path, locked_at: dict[str, list[float]]) -> None:
    """With poll_interval=5 s a follower retries only every 5 s: a fast takeover is the inotify wake-up."""
    path = tmp_path / "x.lock"
    wakeups: list[float] = []
    takeovers: list[float] = []
    async with make(path, "a", poll_interval=5.0) as a, make(path, "b", poll_interval=5.0) as b:
        for _ in range(10):
            lead = await a.acquire()
            got: list[tuple[float, Leadership]] = []

            async def follow(got: list[tuple[float, Leadership]]) -> None:
                successor = await b.acquire()
                got.append((time.monotonic(), successor))

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(follow, got)
                    await asyncio.sleep(random.uniform(0.05, 0.15))  # b waits, past any early retry
                    assert not got
                    released = time.monotonic()
                    await lead.release()
            at, successor = got[0]
            wakeups.append(locked_at["b"][-1] - released)
            takeovers.append(at - released)
            assert successor.token == (lead.token or 0) + 1
            await successor.release()
        assert inotify_fds() <= 1, "one inotify instance per event loop"
    assert inotify_fds() == 0
    median = statistics.median(wakeups)
    print(
        f"file wake-up after release: median {median * 1000:.2f} ms, max {max(wakeups) * 1000:.2f} ms "
        f"(leader, sidecar written: median {statistics.median(takeovers) * 1000:.2f} ms)"
    )
    assert median < 0.02, wakeups
    assert max(wakeups) < 1.0 and statistics.median(takeovers) < 0.5, (wakeups, takeovers)


async def _alternate(electors: list[FileElector], leaderships: int) -> list[str]:
    """Each elector releases as soon as it leads and campaigns again at once; return who led, in order."""
    order: list[str] = []
    done = anyio.Event()

    async def pingpong(elector: FileElector) -> None:
        while not done.is_set():
            lead = await elector.acquire()
            order.append(elector.identity)
            if len(order) >= leaderships:
                done.set()
            await lead.release()

    async with anyio.create_task_group() as tg:
        for elector in electors:
            tg.start_soon(pingpong, elector)
        await done.wait()
        tg.cancel_scope.cancel()
    return order


@pytest.mark.parametrize("wake", ["inotify", "polling"])
async def test_releaser_hands_over_to_a_waiter_in_one_process(
    tmp_path: Path, wake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if wake == "polling":
        monkeypatch.setattr(file_inotify, "libc", None)
    elif file_inotify.libc is None:
        pytest.skip("inotify is Linux-only")
    path = tmp_path / "x.lock"
    count = 100 if wake == "inotify" else 12
    async with make(path, "a") as a, make(path, "b") as b:
        started = time.monotonic()
        with anyio.fail_after(30):
            order = await _alternate([a, b], count)
        took = time.monotonic() - started
    handoffs = sum(1 for x, y in itertools.pairwise(order) if x != y)
    print(
        f"file handover in one process ({wake}): {handoffs} of {len(order) - 1} leaderships changed hands, "
        f"{handoffs / took:.0f} handoffs/s"
    )
    assert handoffs >= 0.9 * (len(order) - 1), order
    assert json.loads((tmp_path / "x.lock.leader").read_text())["token"] == len(order)
    assert not file_inotify.watchers and inotify_fds() == 0


async def test_releaser_hands_over_to_a_waiter_across_processes(tmp_path: Path, procs: list[Proc]) -> None:
    path = tmp_path / "x.lock"
    barrier = tmp_path / "go"
    marker = tmp_path / "critical"
    rounds = 60
    procs.extend(
        Proc(path, f"p{i}", rounds=rounds, hold=0, marker=marker, barrier=barrier, poll_interval=5) for i in range(2)
    )
    for p in procs:
        await p.wait_for("ready")
    barrier.touch()
    await all_done(procs, timeout=60)
    assert not any(p.named("overlap") for p in procs)
    leads = sorted((e["t"], e["token"], i) for i, p in enumerate(procs) for e in p.named("lead"))
    assert [token for _, token, _ in leads] == list(range(1, 2 * rounds + 1))
    # Only the rounds both processes campaign in: one may start late and then finishes alone, by as many
    # rounds as it was late (tens of rounds on a loaded machine: a round takes about 2 ms).
    both_from = max(min(t for t, _, who in leads if who == i) for i in (0, 1))
    both_until = min(max(t for t, _, who in leads if who == i) for i in (0, 1))
    middle = [lead for lead in leads if both_from <= lead[0] <= both_until]
    assert len(middle) >= rounds // 2, f"the processes campaigned together for {len(middle)} rounds only"
    handoffs = sum(1 for x, y in itertools.pairwise(middle) if x[2] != y[2])
    rate = handoffs / (middle[-1][0] - middle[0][0])
    print(f"file handover across processes: {handoffs} of {len(middle) - 1} changed hands, {rate:.0f} handoffs/s")
    assert handoffs >= 0.9 * (len(middle) - 1), [who for _, _, who in leads]
    # With poll_interval=5 s, a handover that waited for the 0.25 s bound would make under 4/s.
    assert rate > 10, "handing over must not wait for a timer"


async def test_idle_waiters_do_not_poll(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """100 waiting electors in one process: their flock tries and the process's CPU time over 3 s;
    then their tries while an observer asks leader() 50 times a second (it must not wake them)."""
    path = tmp_path / "x.lock"
    count, window = 100, 3.0
    tries = 0
    real_flock = fcntl.flock

    def counting_flock(fd: int, operation: int) -> None:
        nonlocal tries
        if operation == fcntl.LOCK_EX | fcntl.LOCK_NB:
            tries += 1
        real_flock(fd, operation)

    async with make(path, "leader", check_interval=1.0) as leader, make(path, "observer") as observer:
        lead = await leader.acquire()
        electors = [make(path, f"w{i}") for i in range(count)]
        try:
            async with anyio.create_task_group() as tg:
                for elector in electors:
                    tg.start_soon(elector.acquire)
                await asyncio.sleep(1.5)  # all announced and past their first tries
                monkeypatch.setattr(fcntl, "flock", counting_flock)
                cpu, wall = time.process_time(), time.monotonic()
                await asyncio.sleep(window)
                cpu, wall = time.process_time() - cpu, time.monotonic() - wall
                idle_tries, tries = tries, 0
                observed, started = 0, time.monotonic()
                with anyio.move_on_after(window / 2):
                    while True:
                        assert await observer.leader() == "leader"
                        observed += 1
                        await asyncio.sleep(0.02)
                observed_wall = time.monotonic() - started
                monkeypatch.undo()
                assert not any(e.leading for e in electors) and lead.held
                tg.cancel_scope.cancel()
        finally:
            for elector in electors:
                await elector.aclose()
        await lead.release()
    idle_rate, observed_rate = idle_tries / wall, tries / observed_wall
    print(
        f"file: {count} idle waiters made {idle_rate:.0f} tries/s and used {100 * cpu / wall:.2f} % of a core; "
        f"{observed_rate:.0f} tries/s with {observed / observed_wall:.0f} leader() calls/s"
    )
    # The old 50 ms polling made 2000 tries/s here; a probe that woke the waiters would make 10000.
    expected = count / file_backend._FALLBACK if file_inotify.libc is not None else count / 0.05
    assert idle_rate < 2 * expected + 20, f"{idle_rate:.0f} tries/s"
    assert observed_rate < 2 * expected + 20, f"{observed_rate:.0f} tries/s while observed"
    if file_inotify.libc is not None:
        assert cpu / wall < 0.02, f"{100 * cpu / wall:.2f} % of a core"
    assert inotify_fds() == 0


async def test_handover_wait_is_bounded_by_a_stuck_waiter(tmp_path: Path, locked_at: dict[str, list[float]]) -> None:
    """A waiter that never tries (frozen) delays a new campaign by the bounded handover only."""
    path = tmp_path / "x.lock"
    async with make(path, "a", poll_interval=5.0) as a:  # handover: min(2 * 5 s, 0.25 s)
        started = time.monotonic()
        lead = await a.acquire()
        alone = locked_at["a"][-1] - started
        await lead.release()
        stuck = os.open(str(path) + ".waiting", os.O_RDONLY)
        try:
            fcntl.flock(stuck, fcntl.LOCK_SH)  # what a waiting candidate holds
            started = time.monotonic()
            with anyio.fail_after(5):
                lead = await a.acquire()
            deferred = locked_at["a"][-1] - started
            await lead.release()
        finally:
            os.close(stuck)
    print(f"file campaign: locked {alone * 1000:.1f} ms alone, {deferred * 1000:.1f} ms behind a stuck waiter")
    assert alone < 0.2, "nobody waits: no reason to stay out"
    assert 0.2 <= deferred < 2.0, deferred


@needs_inotify
async def test_forked_child_does_not_stay_in_the_queue(tmp_path: Path) -> None:
    """A child forked while a campaign waits closes its copies: no phantom waiter, and closes stay visible."""
    path = tmp_path / "x.lock"
    async with make(path, "a") as a, make(path, "b") as b, make(path, "c", poll_interval=5.0) as c:
        lead = await a.acquire()
        task = asyncio.ensure_future(b.acquire())
        await asyncio.sleep(0.1)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child: outlives the campaign it inherited
            time.sleep(3)  # noqa: ASYNC251 - in the forked child, no event loop runs
            os._exit(0)
        try:
            await lead.release()
            with anyio.fail_after(2):
                b_lead = await task
            probe = os.open(str(path) + ".waiting", os.O_RDONLY)
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails if the child kept b's place
            finally:
                os.close(probe)
            waiting = asyncio.ensure_future(c.acquire())
            await asyncio.sleep(0.1)
            released = time.monotonic()
            await b_lead.release()  # the child shares nothing with b's lock: this close wakes c
            with anyio.fail_after(2):
                c_lead = await waiting
            assert time.monotonic() - released < 1.0
            await c_lead.release()
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # noqa: ASYNC222 - returns at once after SIGKILL


# --- a directory other users share (/tmp) ----------------------------------------------

#: The second local user of these tests: "nobody" (any uid works for a forked child; no account is needed).
STRANGER = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second local user needs root")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory like /tmp: every user may create files in it; sticky, so only owners remove theirs."""
    base = Path(tempfile.mkdtemp(prefix="aioelect-shared-"))
    try:
        base.chmod(0o1777)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _in_child(
    action: Callable[[], str],
    *,
    uid: int = STRANGER,
    gid: int = STRANGER,
    groups: Sequence[int] = (),
    timeout: float = 20,
) -> str:
    """Run ``action`` in a forked child as ``uid``/``gid``; return what it returned (or the error it raised).

    No exec: the child has what this process imported (another user may not read the interpreter's files).
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        message = "child failed"
        try:
            os.close(read_end)
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            message = action()
        except BaseException as exc:
            message = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write_end, message.encode()[:60000])
            os._exit(0)
    os.close(write_end)
    chunks: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "the child did not finish"
            if select.select([read_end], [], [], left)[0]:
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


@contextlib.contextmanager
def _stranger_holds(path: Path) -> Iterator[None]:
    """Another user creates ``path`` (world-readable and writable) and holds an exclusive flock on it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(STRANGER)
            os.setuid(STRANGER)
            os.umask(0)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(write_end, b"held")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        assert select.select([read_end], [], [], 10)[0], "the stranger did not start"
        assert os.read(read_end, 16) == b"held"
        yield
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@contextlib.contextmanager
def _unblock_fifo_after(delay: float, path: Path) -> Iterator[None]:
    """After ``delay``, keep opening the FIFO at ``path`` for writing: a reader blocked in open() returns.

    Only code that opens the FIFO and waits needs it; it turns such a hang into a slow failure.
    """
    stop = threading.Event()

    def run() -> None:
        if stop.wait(delay):
            return
        while not stop.is_set():
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            stop.wait(0.1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


class Ticks:
    """The longest gap between ticks of a task that sleeps 10 ms at a time: how long the loop was blocked."""

    def __init__(self) -> None:
        self.longest = 0.0


@contextlib.asynccontextmanager
async def ticking() -> AsyncIterator[Ticks]:
    ticks = Ticks()

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            ticks.longest = max(ticks.longest, now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        yield ticks
        tg.cancel_scope.cancel()


def _modes(path: Path) -> dict[str, int]:
    names = {"lock": path, "sidecar": Path(str(path) + ".leader"), "waiting": Path(str(path) + ".waiting")}
    return {what: stat.S_IMODE(p.stat().st_mode) for what, p in names.items()}


async def _lead_once(elector: FileElector) -> int:
    lead = await elector.acquire()
    await lead.release()
    assert lead.token is not None
    return lead.token


async def test_files_are_private_by_default_whatever_the_umask(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = os.umask(0)
    try:
        (tmp_path / "default").mkdir(mode=0o700)
        path = tmp_path / "default" / "x.lock"
        async with make(path, "a") as a:
            await _lead_once(a)
        assert _modes(path) == {"lock": 0o600, "sidecar": 0o600, "waiting": 0o600}
        # A group of service users: exactly the mode asked for, even under a umask that removes it.
        os.umask(0o077)
        (tmp_path / "group").mkdir(mode=0o700)
        path = tmp_path / "group" / "x.lock"
        async with make(path, "a", mode=0o660) as a:
            await _lead_once(a)
        assert _modes(path) == {"lock": 0o660, "sidecar": 0o660, "waiting": 0o660}
        # A file of ours that is wider than the mode is narrowed, with a warning.
        os.umask(0o022)
        (tmp_path / "wide").mkdir(mode=0o700)
        path = tmp_path / "wide" / "x.lock"
        path.touch(mode=0o644)
        with caplog.at_level(logging.WARNING, logger="aioelect"):
            async with make(path, "a") as a:
                await _lead_once(a)
        assert _modes(path)["lock"] == 0o600
        assert any(str(path) in r.getMessage() and "0o644" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        os.umask(old)


def test_mode_never_lets_every_user_in(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for bad in (0o666, 0o644, 0o640, 0o604, 0o400, 0o700, 0o770, 0o1600, -1, True, "0600", 1.5):
        with pytest.raises(ValueError, match="mode"):
            FileElector(tmp_path / "x.lock", mode=bad)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="aioelect"):
        FileElector(tmp_path / "x.lock", mode=0o660)
    assert any("mode=0o660" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert not (tmp_path / "x.lock").exists()


@pytest.mark.parametrize("suffix", ["", ".leader", ".waiting"])
async def test_a_symlink_at_a_path_is_refused(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / "x.lock"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "target"
    if suffix == ".leader":
        target.write_text(json.dumps({"identity": "planted", "token": 100}))
    link = Path(str(path) + suffix)
    os.symlink(target, link)
    async with make(path, "a") as a:
        with anyio.fail_after(5), pytest.raises(PermanentBackendError, match="symbolic link") as info:
            await a.acquire()
        assert not a.leading
    assert str(link) in str(info.value)
    assert stat.S_ISLNK(os.lstat(link).st_mode), "the link is left for a person to look at"
    if suffix != ".leader":
        assert not target.exists(), "nothing may be created through a symbolic link"
    assert lock_fds(path) == 0


@pytest.mark.parametrize("suffix", ["", ".leader", ".waiting"])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
async def test_a_fifo_or_directory_at_a_path_is_a_clear_error_never_a_hang(
    tmp_path: Path, kind: str, suffix: str
) -> None:
    path = tmp_path / "x.lock"
    target = Path(str(path) + suffix)
    async with make(path, "a") as a:
        if kind == "fifo":
            os.mkfifo(target)
        else:
            os.mkdir(target)  # after construction: the constructor refuses a directory at path
        with _unblock_fifo_after(3.0, target):
            async with ticking() as ticks:
                started = time.monotonic()
                with anyio.fail_after(10), pytest.raises(ElectionError) as info:
                    await a.acquire()
                took = time.monotonic() - started
                if suffix == ".leader":  # an observer meets it too, once someone holds the lock
                    holder = os.open(path, os.O_RDONLY)
                    try:
                        fcntl.flock(holder, fcntl.LOCK_EX)
                        with anyio.fail_after(10), pytest.raises(ElectionError, match="not a regular file"):
                            await a.leader()
                    finally:
                        os.close(holder)
        assert not a.leading
    message = str(info.value)
    assert str(target) in message and "not a regular file" in message, message
    assert took < 2.0, f"took {took:.1f}s: something waited on the {kind}"
    assert ticks.longest < 0.5, f"the event loop was blocked for {ticks.longest:.1f}s"
    assert lock_fds(path) == 0


@needs_root
@pytest.mark.parametrize("suffix", ["", ".leader", ".waiting"])
async def test_a_file_owned_by_another_user_is_refused(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / "x.lock"
    target = Path(str(path) + suffix)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, json.dumps({"identity": "planted", "token": 7}).encode() if suffix == ".leader" else b"")
    os.close(fd)
    os.chown(target, STRANGER, STRANGER)
    async with make(path, "a") as a:
        with anyio.fail_after(5), pytest.raises(ElectionError) as info:
            await a.acquire()
        assert not a.leading
    message = str(info.value)
    assert str(target) in message and "owned by" in message and "nobody" in message, message
    assert lock_fds(path) == 0


@needs_root
async def test_a_stranger_cannot_open_the_files_to_hold_the_lock(shared_dir: Path) -> None:
    path = shared_dir / "x.lock"
    async with make(path, "a") as a:
        await _lead_once(a)

    def try_to_lock() -> str:
        results = []
        for target in (path, Path(str(path) + ".leader"), Path(str(path) + ".waiting")):
            try:
                fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
            except PermissionError:
                results.append("denied")
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                results.append("locked")
            except BlockingIOError:
                results.append("busy")
            finally:
                os.close(fd)
        return ",".join(results)

    assert _in_child(try_to_lock) == "denied,denied,denied"


@needs_root
async def test_a_lock_file_planted_by_a_stranger_is_refused_not_waited_on(shared_dir: Path) -> None:
    path = shared_dir / "x.lock"
    with _stranger_holds(path):
        async with make(path, "a") as a:
            with anyio.fail_after(5), pytest.raises(ElectionError) as info:
                await a.acquire()
    message = str(info.value)
    assert str(path) in message and "owned by" in message and "nobody" in message, message


@needs_root
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    """Its owner could rename the lock file away and let a second candidate lead on a new one."""
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o755)
    os.chown(directory, STRANGER, STRANGER)
    with pytest.raises(ValueError, match=r"owned by nobody \(uid 65534\)"):
        FileElector(directory / "x.lock")
    with pytest.raises(ValueError, match="owned by nobody"):
        FileElector(directory / "x.lock", mode=0o660)  # its group is not one of ours either
    os.chown(directory, 0, 0)
    FileElector(directory / "x.lock")  # root's directories are trusted


def test_a_directory_its_group_may_write_without_the_sticky_bit_needs_mode_0o660(tmp_path: Path) -> None:
    """A member of the group could rename the held lock file away: accepted only when the group is trusted."""
    directory = tmp_path / "group"
    directory.mkdir()
    directory.chmod(0o770)
    with pytest.raises(ValueError, match=r"written by its group and is not sticky.*mode=0o660"):
        FileElector(directory / "x.lock")
    with pytest.raises(ValueError, match="written by its group"):
        FileElector(directory / "x.lock", mode=0o600)
    FileElector(directory / "x.lock", mode=0o660)  # the group's users are candidates: asked for
    directory.chmod(0o1770)  # sticky: members may add files but not rename ours
    FileElector(directory / "x.lock")
    directory.chmod(0o750)
    FileElector(directory / "x.lock")


def test_a_directory_every_user_may_write_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "open"
    directory.mkdir()
    directory.chmod(0o777)
    with pytest.raises(ValueError, match="sticky"):
        FileElector(directory / "x.lock")
    directory.chmod(0o1777)  # like /tmp: others may create files but not remove or rename ours
    elector = FileElector(directory / "x.lock")
    directory.chmod(0o777)

    async def campaign() -> None:
        async with elector:
            with anyio.fail_after(5):
                await elector.acquire()

    with pytest.raises(ElectionError, match="sticky"):
        anyio.run(campaign)


@needs_root
def test_mode_0660_shares_an_election_between_the_users_of_a_group(tmp_path: Path) -> None:
    group = STRANGER  # "nogroup": the users below are in it, root is not

    async def cycle(path: Path, identity: str, **kw: Any) -> int:
        async with FileElector(path, identity=identity, check_interval=0.2, **kw) as elector:
            return await _lead_once(elector)

    warm = tmp_path / "warm"  # import what the children need while files can still be read
    warm.mkdir()
    assert asyncio.run(cycle(warm / "x.lock", "root")) == 1
    base = Path(tempfile.mkdtemp(prefix="aioelect-group-"))
    try:
        os.chown(base, 0, group)
        base.chmod(0o2770)  # setgid: new files belong to the group
        path = base / "x.lock"
        tokens = [
            _in_child(lambda i=i: str(asyncio.run(cycle(path, f"u{i}", mode=0o660))), uid=60001 + i, gid=group)
            for i in range(2)
        ]
        assert tokens == ["1", "2"], tokens
        assert _modes(path) == {"lock": 0o660, "sidecar": 0o660, "waiting": 0o660}
        assert path.stat().st_gid == group and (base / "x.lock.leader").stat().st_uid == 60002
        # A user of the group that did not ask for group access refuses the directory the group may write to.
        refused = _in_child(lambda: str(asyncio.run(cycle(path, "u3"))), uid=60003, gid=group)
        assert refused.startswith("ValueError") and "written by its group" in refused, refused
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_deleting_the_sidecar_or_an_idle_lock_file_does_not_reset_the_token(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    async with make(path, "a") as a:
        tokens = [await _lead_once(a)]
        os.unlink(a.sidecar)  # a tmp cleaner
        tokens.append(await _lead_once(a))
        path.unlink()  # while nobody holds it
        tokens.append(await _lead_once(a))
    assert tokens == [1, 2, 3]


async def test_a_lock_file_with_other_content_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    path.write_text("12345\n")  # a pid file, say
    path.chmod(0o600)
    async with make(path, "a") as a:
        with anyio.fail_after(5), pytest.raises(ElectionError, match="not an aioelect lock file") as info:
            await a.acquire()
    assert str(path) in str(info.value)
    assert path.read_text() == "12345\n"


async def test_the_sidecar_is_read_within_a_bound(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    sidecar = tmp_path / "x.lock.leader"
    sidecar.write_bytes(json.dumps({"identity": "big", "token": 5}).encode() + b" " * (1 << 20))
    sidecar.chmod(0o600)
    async with make(path, "a") as a:
        with anyio.fail_after(5), pytest.raises(ElectionError, match="larger than") as info:
            await a.acquire()
    assert str(sidecar) in str(info.value)


async def test_no_file_io_on_the_event_loop_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Path lookups, reads, writes, fsync and renames run in worker threads: a slow disk, a FIFO
    or a hung mount must not stop the event loop. Construction (validation) is done before."""
    path = tmp_path / "x.lock"
    a, b = make(path, "a", check_interval=0.05), make(path, "b", check_interval=0.05)
    loop_thread = threading.get_ident()
    seen: list[str] = []

    def spy(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            if threading.get_ident() == loop_thread:
                first = args[0] if args else None
                if not (name == "os.read" and os.readlink(f"/proc/self/fd/{first}") == "anon_inode:inotify"):
                    seen.append(f"{name}({first!r})")
            return real(*args, **kw)

        return call

    for name in ("open", "stat", "lstat", "read", "pread", "write", "pwrite", "fsync", "replace", "rename", "unlink"):
        monkeypatch.setattr(os, name, spy(f"os.{name}", getattr(os, name)))
    monkeypatch.setattr(builtins, "open", spy("open", builtins.open))

    async def follow(done: anyio.Event) -> None:
        again = await b.acquire()
        assert await a.leader() == "b"
        await again.release()
        done.set()

    async with a, b:
        lead = await a.acquire()
        assert await b.leader() == "a"
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow, done)
            await asyncio.sleep(0.3)  # a's check of its lock file runs a few times; b waits
            await lead.release()
            with anyio.fail_after(5):
                await done.wait()
    monkeypatch.undo()
    assert not seen, seen


async def test_the_leader_watchs_probe_never_delays_a_campaign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone candidate leads at once, even when the probe of its own leader watch holds its shared lock a while.

    The watch that runs beside every campaign probes the lock file with an instant
    shared lock; a try that met it used to wait for a close event that never came
    (the whole ``poll_interval``). Here each probe holds its shared lock for 0.2 s,
    so the campaign's first try meets it.
    """
    from aioelect.backends.file import _lock

    real_flock = fcntl.flock

    def slow_probe(fd: int, operation: int) -> None:
        real_flock(fd, operation)
        # The leader probe: a shared lock taken in a worker thread (the campaign's tries run on the loop).
        if operation == fcntl.LOCK_SH | fcntl.LOCK_NB and threading.current_thread() is not threading.main_thread():
            time.sleep(0.2)  # a worker thread: the loop goes on

    monkeypatch.setattr(_lock.fcntl, "flock", slow_probe)
    took = []
    for i in range(3):
        async with FileElector(tmp_path / f"x{i}.lock", identity=f"c{i}", poll_interval=5.0) as elector:
            started = time.monotonic()
            with anyio.fail_after(10):
                lead = await elector.acquire()
            took.append(time.monotonic() - started)
            await lead.release()
    print(f"lone campaigns beside a slow probe: {[round(t, 3) for t in took]} s")
    assert max(took) < 1.5, took


@pytest.mark.parametrize("option", ["poll_interval", "check_interval"])
@pytest.mark.parametrize("value", [1e-300, 0.001, 0.0099])
def test_intervals_below_the_floor_are_refused(tmp_path: Path, option: str, value: float) -> None:
    """A poll or check every 1e-300 s would burn a core: refused, naming the option and the floor."""
    with pytest.raises(ValueError, match=rf"{option} must be at least 0\.01 seconds"):
        FileElector(tmp_path / "x.lock", **{option: value})
    FileElector(tmp_path / "x.lock", **{option: 0.01})


def test_a_descriptor_opened_for_a_campaign_already_ended_is_closed(tmp_path: Path) -> None:
    """A task.cancel() can end a campaign while its worker thread still opens the lock file: what the thread
    opens after the campaign closed its attempt is closed at once, never left open by nobody."""
    from aioelect.backends.file._waiters import Attempt

    attempt = Attempt()
    kept = os.open(tmp_path / "kept", os.O_CREAT | os.O_RDWR, 0o600)
    attempt.adopt("lock_fd", kept)
    attempt.close()
    assert attempt.lock_fd == -1 and not os.path.exists(f"/proc/self/fd/{kept}")  # closed with the attempt
    late = os.open(tmp_path / "late", os.O_CREAT | os.O_RDWR, 0o600)
    with pytest.raises(OSError) as raised:
        attempt.adopt("waiting_fd", late)
    assert raised.value.errno == errno.ECANCELED
    assert attempt.waiting_fd == -1
    with pytest.raises(OSError):
        os.fstat(late)  # closed by adopt()
