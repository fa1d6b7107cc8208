"""aioelect.testing: MemoryElector, its controls, the pytest11 fixtures and the docs example that uses them.

The contract suite runs on the memory backend too (tests/backends.py); what is
tested here is what only it has: the controls a user's test drives.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from aioelect import BackendUnavailable, ElectionError, Event, LeadershipLost, leadership
from aioelect.testing import MemoryElector

from .backends import Follower, unique_name

ROOT = Path(__file__).resolve().parent.parent
README_MARKER = "<!-- test: example run by tests/test_testing.py -->"


async def test_deposing_the_leader_raises_leadership_lost_within_milliseconds() -> None:
    name = unique_name()
    async with MemoryElector(name=name, identity="a") as a, MemoryElector(name=name, identity="b") as b:
        follower = Follower(b)
        reached_end = False
        with pytest.raises(LeadershipLost, match="maintenance") as info:
            async with leadership(a) as lead:
                assert a.depose("maintenance") == "a"
                deposed = time.monotonic()
                await asyncio.sleep(30)
                reached_end = True
        took = time.monotonic() - deposed
        assert not reached_end and took < 0.1, f"LeadershipLost {took:.3f}s after the depose"
        assert info.value.reason == "maintenance" and lead.lost_reason == "maintenance" and not lead.held
        successor = await follower.wait(timeout=1)
        assert successor.identity == "b" and successor.token == (lead.token or 0) + 1
        assert await a.leader() == "b"
        await follower.close()


async def test_stalled_confirmations_fence_the_leader_at_its_renew_deadline() -> None:
    async with MemoryElector(name=unique_name(), renew_deadline=0.2) as elector:
        confirmed: list[Event] = []
        elector.add_listener(lambda event: confirmed.append(event) if event.kind == "confirmed" else None)
        lead = await elector.acquire()
        await asyncio.sleep(0.6)  # three renew deadlines: confirmations keep it
        assert lead.held and len(confirmed) >= 6
        assert elector.stall() == lead.identity
        stalled = time.monotonic()
        confirmed.clear()
        with anyio.fail_after(2):
            await lead.wait_lost()
        took = time.monotonic() - stalled
        assert 0.15 <= took < 0.5, f"fenced {took:.3f}s after the stall, renew_deadline is 0.2s"
        assert lead.lost_reason is not None and "renew deadline" in lead.lost_reason
        assert not confirmed, "a stalled leader confirmed"
        with anyio.fail_after(2):
            while await elector.leader() is not None:  # the fenced leader lets go
                await asyncio.sleep(0.01)


async def test_restore_before_the_deadline_keeps_a_stalled_leader() -> None:
    async with MemoryElector(name=unique_name(), renew_deadline=0.3) as elector:
        lead = await elector.acquire()
        elector.stall()
        await asyncio.sleep(0.1)
        elector.restore()
        await asyncio.sleep(0.6)
        assert lead.held and not lead.lost


async def test_a_failed_server_makes_acquire_retry_until_it_is_restored() -> None:
    async with MemoryElector(name=unique_name()) as elector:
        errors: list[str] = []
        elector.add_listener(lambda event: errors.append(event.reason or "") if event.kind == "error" else None)
        elector.fail("switch rebooting")
        with pytest.raises(BackendUnavailable, match="switch rebooting"):
            await elector.leader()
        campaign = asyncio.create_task(elector.acquire())
        await asyncio.sleep(0.4)
        assert not campaign.done(), "led while the server was failing"
        assert len(errors) >= 3 and all("switch rebooting" in e for e in errors), errors
        elector.restore()
        restored = time.monotonic()
        with anyio.fail_after(2):
            lead = await campaign
        assert time.monotonic() - restored < 0.1
        assert lead.token == 1
        # campaign's task has ended, which releases the leadership it acquired
        with anyio.fail_after(2):
            while await elector.leader() is not None:
                await asyncio.sleep(0.01)


async def test_a_failed_server_fences_the_leader_at_its_renew_deadline() -> None:
    async with MemoryElector(name=unique_name(), renew_deadline=0.2) as elector:
        lead = await elector.acquire()
        elector.fail()
        failed = time.monotonic()
        with anyio.fail_after(2):
            await lead.wait_lost()
        assert 0.15 <= time.monotonic() - failed < 0.5
        assert lead.lost_reason is not None and "renew deadline" in lead.lost_reason
        elector.restore()
        again = await elector.acquire(timeout=1)
        assert again.held and again.token == 2
        await again.release()


async def test_candidates_lead_in_the_order_they_began_to_wait() -> None:
    name = unique_name()
    electors = [MemoryElector(name=name, identity=f"c{i}") for i in range(4)]
    try:
        first = await electors[0].acquire()
        followers = []
        for elector in electors[1:]:
            followers.append(Follower(elector))
            await asyncio.sleep(0.01)
        order = []
        lead = first
        for follower in followers:
            await lead.release()
            lead = await follower.wait(timeout=1)
            order.append((lead.identity, lead.token))
        assert order == [("c1", 2), ("c2", 3), ("c3", 4)]
        for follower in followers:
            await follower.close()
    finally:
        for elector in electors:
            await elector.aclose()


async def test_observe_reports_each_change_at_once() -> None:
    name = unique_name()
    async with MemoryElector(name=name, identity="x") as x, MemoryElector(name=name) as watcher:
        seen: list[tuple[str | None, float]] = []

        async def watch() -> None:
            async for current in watcher.observe():
                seen.append((current, time.monotonic()))

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            with anyio.fail_after(1):
                while not seen:
                    await asyncio.sleep(0)
            lead = await x.acquire()
            acquired = time.monotonic()
            with anyio.fail_after(1):
                while len(seen) < 2:
                    await asyncio.sleep(0)
            x.depose()
            with anyio.fail_after(1):
                while len(seen) < 3:
                    await asyncio.sleep(0)
            tg.cancel_scope.cancel()
        assert [who for who, _ in seen] == [None, "x", None]
        assert seen[1][1] - acquired < 0.05
        assert lead.lost


async def test_each_event_loop_and_each_name_has_its_own_election() -> None:
    async def lead_once(name: str) -> tuple[int | None, str | None]:
        async with MemoryElector(name=name, identity="solo") as elector:
            lead = await elector.acquire()
            seen = await MemoryElector(name=name).leader()
            await lead.release()
            return lead.token, seen

    # Each asyncio.run() is a new event loop, as each test is: no leader or token carries over.
    results = [await anyio.to_thread.run_sync(asyncio.run, lead_once("shared")) for _ in range(2)]
    assert results == [(1, "solo"), (1, "solo")]
    async with MemoryElector(name="one") as one, MemoryElector(name="two") as two:
        a, b = await one.acquire(), await two.acquire()
        assert a.held and b.held and a.token == b.token == 1
        await a.release()
        await b.release()


async def test_controls_refuse_what_cannot_be_done() -> None:
    async with MemoryElector(name=unique_name()) as elector:
        with pytest.raises(LookupError, match="nobody leads"):
            elector.depose()
        with pytest.raises(LookupError, match="nobody leads"):
            elector.stall()
        with pytest.raises(ValueError, match="reason"):
            elector.fail("")
        lead = await elector.acquire()
        with pytest.raises(ElectionError, match="leading"):
            await elector.acquire()
        await lead.release()


def test_controls_outside_an_event_loop_say_why() -> None:
    elector = MemoryElector(name=unique_name())
    with pytest.raises(RuntimeError, match="event loop"):
        elector.depose()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"renew_deadline": 0}, "renew_deadline"),
        ({"renew_deadline": float("nan")}, "renew_deadline"),
        ({"check_interval": -1}, "check_interval"),
        ({"renew_deadline": 0.2, "check_interval": 0.2}, "shorter than renew_deadline"),
        ({"name": "has space"}, "name"),
        ({"stop_timeout": 0}, "stop_timeout"),
    ],
)
def test_bad_options_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MemoryElector(**options)  # type: ignore[arg-type]


def test_the_testing_module_starts_nothing() -> None:
    """aioelect.testing is what users import: no harness, no subprocess, no server in it."""
    code = (
        "import sys, aioelect.testing, aioelect.pytest_plugin\n"
        "heavy = [m for m in ('tests', 'tests.harness', 'aiomysql', 'asyncpg', 'aetcd') "
        "if m in sys.modules]\n"
        "print(sorted(aioelect.testing.__all__), heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['MemoryElector'] []", done.stdout
    source = (ROOT / "aioelect" / "testing.py").read_text() + (ROOT / "aioelect" / "pytest_plugin.py").read_text()
    for word in ("subprocess", "setuid", "mariadb-install-db", "initdb", "TCPProxy", "openssl"):
        assert word not in source


def run_pytest_on(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run pytest in a fresh process on one test file written to ``tmp_path`` (outside this repository)."""
    test_file = tmp_path / "test_user.py"
    test_file.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args, str(test_file)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def readme_example() -> str:
    readme = (ROOT / "docs" / "testing.md").read_text()
    assert README_MARKER in readme, "docs/testing.md lost its tested example"
    after = readme.split(README_MARKER, 1)[1]
    match = re.match(r"\s*(?:<!-- docs-test: pytest -->\n)?```python\n(.*?)\n```", after, re.S)
    assert match is not None, "the docs marker must stand right above a ```python block"
    return match.group(1) + "\n"


def test_the_readme_example_runs_and_passes(tmp_path: Path) -> None:
    """The docs page's user test (depose a leader, see LeadershipLost) runs as a user's pytest run would."""
    source = readme_example()
    assert "depose(" in source and "LeadershipLost" in source and "memory_elector" in source
    done = run_pytest_on(tmp_path, source)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr


def test_the_pytest11_fixtures_reach_a_users_test_run(tmp_path: Path) -> None:
    source = textwrap.dedent(
        """
        import pytest

        from aioelect.testing import MemoryElector

        made = []
        names = []


        @pytest.mark.asyncio
        async def test_one(memory_elector, aioelect_name):
            a, b = memory_elector(identity="a"), memory_elector(identity="b")
            assert isinstance(a, MemoryElector) and a.name == b.name == aioelect_name
            names.append(aioelect_name)
            made.append(a)
            await a.acquire()  # still leading when the test ends
            assert await b.leader() == "a"


        @pytest.mark.asyncio
        async def test_two(memory_elector, aioelect_name):
            names.append(aioelect_name)
            with pytest.raises(Exception, match="closed"):
                await made[0].acquire()
            assert memory_elector(name="other").name == "other"
            assert names[0] != names[1]
        """
    )
    done = run_pytest_on(tmp_path, source)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout + done.stderr
    # Without the entry point's plugin the fixtures do not exist: it is the plugin that provides them.
    without = run_pytest_on(tmp_path, source, "-p", "no:aioelect")
    assert without.returncode != 0 and "fixture 'memory_elector' not found" in without.stdout, without.stdout
