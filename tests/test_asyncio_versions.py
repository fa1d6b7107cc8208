"""What differs between the supported Pythons, and what aioelect guarantees on each.

noxfile.py runs this file on 3.10, 3.11, 3.12 and 3.13. The differences it covers:

- ``asyncio.wait_for`` runs its argument in a new task up to 3.11 and in the caller's task from
  3.12 on; ``acquire(timeout=...)``, ``asyncio.timeout()`` (3.11+) and ``anyio.fail_after()`` keep
  acquire() in the caller's task on every version, so the leadership stays bound to the caller.
- ``asyncio.timeout()`` tells its own cancellation from an outer one by the task's cancellation
  count (3.11+): aioelect must neither swallow a cancellation nor leave one pending.
- eager tasks (3.12+) run a new task's first step inside ``create_task()``.
- from 3.12 on, ``os.fork()`` in a process with threads warns (``DeprecationWarning``): a user's
  fork may warn at the user's line, never inside aioelect (nor may anything else aioelect does).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import aioelect
from aioelect import Elector, FileElector, Leadership, LocalElector, leadership

PY311 = sys.version_info >= (3, 11)
PY312 = sys.version_info >= (3, 12)
PACKAGE_DIR = str(Path(aioelect.__file__).resolve().parent)
THIS_FILE = str(Path(__file__).resolve())


def asyncio_timeout(seconds: float) -> contextlib.AbstractAsyncContextManager[Any]:
    return asyncio.timeout(seconds)  # 3.11+


@contextlib.asynccontextmanager
async def fail_after(seconds: float) -> Any:
    with anyio.fail_after(seconds):
        yield


#: The deadline scopes that keep acquire() in the caller's task, on the versions that have them.
SCOPES = [
    pytest.param(fail_after, id="anyio.fail_after"),
    pytest.param(
        asyncio_timeout,
        id="asyncio.timeout",
        marks=pytest.mark.skipif(not PY311, reason="asyncio.timeout() is new in Python 3.11"),
    ),
]
Scope = Callable[[float], contextlib.AbstractAsyncContextManager[Any]]


async def acquire_under_fail_after(elector: Elector, seconds: float) -> Leadership:
    with anyio.fail_after(seconds):
        return await elector.acquire()


async def acquire_under_asyncio_timeout(elector: Elector, seconds: float) -> Leadership:
    async with asyncio_timeout(seconds):
        return await elector.acquire()


async def acquire_with_timeout_argument(elector: Elector, seconds: float) -> Leadership:
    return await elector.acquire(timeout=seconds)


#: The ways to bound acquire() that keep it in the caller's task, on the versions that have them.
ACQUIRE_WITHIN = [
    pytest.param(acquire_with_timeout_argument, id="acquire(timeout)"),
    pytest.param(acquire_under_fail_after, id="anyio.fail_after"),
    pytest.param(
        acquire_under_asyncio_timeout,
        id="asyncio.timeout",
        marks=pytest.mark.skipif(not PY311, reason="asyncio.timeout() is new in Python 3.11"),
    ),
]
AcquireWithin = Callable[[Elector, float], Awaitable[Leadership]]


def pending_cancellations() -> int:
    """Cancellation requests the current task has not consumed (3.11+ counts them; 0 before)."""
    task = asyncio.current_task()
    assert task is not None
    return task.cancelling() if PY311 else 0


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def file_candidates(tmp_path: Path, count: int = 2) -> list[FileElector]:
    lock = tmp_path / "versions.lock"
    return [FileElector(lock, name="versions", identity=f"cand-{i}", check_interval=0.2) for i in range(count)]


# --- wait_for: the premise --------------------------------------------------------------------


async def test_wait_for_runs_its_argument_in_the_callers_task_only_from_3_12() -> None:
    """The difference acquire() must survive: up to 3.11 wait_for runs acquire() in a task of its own."""
    outer = asyncio.current_task()

    async def where() -> asyncio.Task[Any] | None:
        return asyncio.current_task()

    inner = await asyncio.wait_for(where(), timeout=5)
    assert (inner is outer) is PY312


# --- deadlines that keep the binding ----------------------------------------------------------


@pytest.mark.parametrize("acquire_within", ACQUIRE_WITHIN)
async def test_leadership_acquired_under_a_deadline_is_bound_to_the_caller(acquire_within: AcquireWithin) -> None:
    async with LocalElector(identity="bound") as elector:
        acquired = asyncio.Event()
        finish = asyncio.Event()
        leads: list[Leadership] = []

        async def owner() -> None:
            leads.append(await acquire_within(elector, 5))
            acquired.set()
            await finish.wait()

        task = asyncio.create_task(owner())
        with anyio.fail_after(5):
            await acquired.wait()
        lead = leads[0]
        await asyncio.sleep(0.2)  # long enough for a leadership bound to a finished inner task to be released
        assert lead.held and not lead.lost, "the leadership ended while the task that acquired it still runs"
        assert await elector.leader() == "bound"

        finish.set()
        await task
        await wait_until(lambda: not lead.held)
        assert not lead.lost
        with anyio.fail_after(5):
            while await elector.leader() is not None:  # the backend lets go just after ``held`` turns False
                await asyncio.sleep(0.01)


@pytest.mark.parametrize("acquire_within", ACQUIRE_WITHIN)
async def test_deadline_while_campaigning_raises_timeout_and_leaves_the_elector_idle(
    acquire_within: AcquireWithin, tmp_path: Path
) -> None:
    leader, follower = file_candidates(tmp_path)
    async with leader, follower:
        first = await leader.acquire()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await acquire_within(follower, 0.3)
        assert time.monotonic() - started < 3.0
        assert pending_cancellations() == 0, "a cancellation request was left pending on the caller"
        assert await follower.leader() == "cand-0"

        await first.release()
        with anyio.fail_after(5):
            second = await follower.acquire()  # the elector campaigns again after the timeout
        assert second.held and second.identity == "cand-1"
        assert first.token is not None and second.token == first.token + 1
        await second.release()


@pytest.mark.parametrize("acquire_within", ACQUIRE_WITHIN)
async def test_outer_cancellation_inside_a_deadline_stays_a_cancellation(
    acquire_within: AcquireWithin, tmp_path: Path
) -> None:
    """Cancelling a task whose acquire() waits under a deadline: CancelledError, not TimeoutError, not lost."""
    leader, follower = file_candidates(tmp_path)
    async with leader, follower:
        first = await leader.acquire()
        campaigning = asyncio.Event()
        outcome: list[BaseException] = []

        async def campaign() -> None:
            campaigning.set()
            try:
                await acquire_within(follower, 30)
            except BaseException as exc:
                outcome.append(exc)
                raise

        task = asyncio.create_task(campaign())
        with anyio.fail_after(5):
            await campaigning.wait()
        await asyncio.sleep(0.2)  # let the campaign block on the held lock
        task.cancel()
        with anyio.fail_after(5), pytest.raises(asyncio.CancelledError):
            await task
        assert [type(exc) for exc in outcome] == [asyncio.CancelledError]

        await first.release()
        with anyio.fail_after(5):
            second = await follower.acquire()
        assert second.held
        await second.release()


@pytest.mark.parametrize("scope", SCOPES)
async def test_deadline_around_a_leadership_scope_releases_without_loss(scope: Scope, tmp_path: Path) -> None:
    (elector,) = file_candidates(tmp_path, 1)
    async with elector:
        leads: list[Leadership] = []
        with pytest.raises(TimeoutError):
            async with scope(0.3), leadership(elector) as lead:
                leads.append(lead)
                await asyncio.sleep(30)
        assert pending_cancellations() == 0
        assert not leads[0].held and not leads[0].lost
        assert await elector.leader() is None


# --- eager tasks (3.12+) ----------------------------------------------------------------------


@pytest.mark.skipif(not PY312, reason="eager tasks are new in Python 3.12")
@pytest.mark.parametrize("backend", ["local", "file"])
async def test_acquire_in_an_eager_task_is_bound_to_that_task(backend: str, tmp_path: Path) -> None:
    elector: Elector = LocalElector(identity="eager") if backend == "local" else file_candidates(tmp_path, 1)[0]
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()
    loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined,unused-ignore]
    try:
        async with elector:
            finish = asyncio.Event()
            leads: list[Leadership] = []

            async def owner() -> None:
                leads.append(await elector.acquire())
                await finish.wait()

            task = asyncio.create_task(owner())
            await wait_until(lambda: bool(leads))
            await asyncio.sleep(0.2)
            assert leads[0].held, "a leadership acquired in an eager task ended while the task runs"
            finish.set()
            await task
            await wait_until(lambda: not leads[0].held)
            assert not leads[0].lost

            async def acquire_and_return() -> Leadership:
                return await elector.acquire()

            # A task that only runs acquire() may finish inside create_task(): still caught, and loudly.
            quick = await asyncio.create_task(acquire_and_return())
            await wait_until(lambda: not quick.held)
            assert quick.lost and "ended as soon as acquire() returned" in (quick.lost_reason or "")
    finally:
        loop.set_task_factory(factory)


# --- fork warnings (3.12+) --------------------------------------------------------------------


def source(warning: warnings.WarningMessage) -> str:
    return str(Path(warning.filename).resolve())


def aioelect_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """The DeprecationWarnings attributed to aioelect's own code."""
    return [
        f"{w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, DeprecationWarning) and source(w).startswith(PACKAGE_DIR + os.sep)
    ]


@contextlib.contextmanager
def all_warnings() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


async def test_fork_of_a_leader_warns_only_at_the_callers_line(tmp_path: Path) -> None:
    """A user's fork while the file backend leads: aioelect's fork handlers, in parent and child, warn nothing."""
    leader, follower = file_candidates(tmp_path)
    async with leader, follower:
        lead = await leader.acquire()
        waiting = asyncio.create_task(follower.acquire())  # a campaign in progress: its fork handling runs too
        await asyncio.sleep(0.2)
        # The case 3.12 warns about: threads (the worker threads the file backend used) at the fork.
        assert threading.active_count() > 1
        read_end, write_end = os.pipe()
        with all_warnings() as caught:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child reports and exits at once
                try:
                    os.close(read_end)
                    os.write(write_end, "\n".join(aioelect_warnings(caught)).encode() or b"none")
                finally:
                    os._exit(0)
            os.close(write_end)
            with os.fdopen(read_end, "rb") as pipe:
                from_child = (await anyio.to_thread.run_sync(pipe.read)).decode()
            _, status = await anyio.to_thread.run_sync(os.waitpid, pid, 0)
            await asyncio.sleep(0.3)  # the parent's handlers and keeper run after the fork
        assert os.waitstatus_to_exitcode(status) == 0
        assert from_child == "none", f"aioelect warned in the forked child: {from_child}"
        assert aioelect_warnings(caught) == []
        fork_warnings = [w for w in caught if issubclass(w.category, DeprecationWarning) and "fork" in str(w.message)]
        if PY312:
            assert [source(w) for w in fork_warnings] == [THIS_FILE]
        else:
            assert fork_warnings == []
        assert lead.held and not lead.lost  # the child's exit left the parent's lock alone
        assert not waiting.done()
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await lead.release()


def test_cli_supervisor_raises_no_deprecation_warning(tmp_path: Path) -> None:
    """``aioelect run`` (threads, a forked CMD, signals) with aioelect's DeprecationWarnings turned into errors."""
    marker = tmp_path / "ran"
    program = (
        "import sys, warnings\n"
        "warnings.simplefilter('always', DeprecationWarning)\n"
        "warnings.filterwarnings('error', category=DeprecationWarning, module='aioelect')\n"
        "from aioelect.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"]
    args = ["run", "--file", str(tmp_path / "cli.lock"), "--name", "versions", "--", *command]
    result = subprocess.run(
        [sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "ran"
    own = [line for line in result.stderr.splitlines() if "Warning" in line and PACKAGE_DIR in line]
    assert own == [], own
    assert "Traceback" not in result.stderr
