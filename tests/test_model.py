"""Model-based test of the public API: random interleavings of operations on several electors of one election.

Hypothesis' stateful testing drives three electors of one election through
acquire, try_acquire, release, cancelling the task that owns a leadership, aclose
(then a fresh elector in its place), ``leader()``, ``observe()`` and ``run()``, on the
memory, local and file backends, with campaigns left waiting across steps so that a
release hands over to a waiter. After every step it checks:

* at most one held leadership per election (except on the local backend, which gives
  no mutual exclusion between electors: there each elector's own state is checked);
* ``held`` is never True after a release or a loss;
* an acquire when nobody else leads always succeeds (in particular after a release);
* at the end, nothing is left behind: every task of the event loop is done and the
  descriptors opened for the election are closed.

Each test case runs in its own event loop, created in the machine's constructor and
closed in ``teardown()``; every step runs its coroutine to completion with
``loop.run_until_complete`` and every wait is bounded. A failure prints the shrunk
sequence of steps and a ``@reproduce_failure`` decorator that replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from aioelect import Elector, FileElector, Leadership, LocalElector, current_leadership
from aioelect.testing import MemoryElector

NAME = "model/election"
SIZE = 3
# Long enough for a free election to be won on a loaded CI machine, short enough to keep the file quick.
WIN_WITHIN = 5.0
# How long an acquire that must not succeed (someone else leads) is given before it times out.
LOSE_WITHIN = 0.05

MODEL_SETTINGS = settings(
    max_examples=50,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@dataclass
class Slot:
    """One candidate: its elector, and the task that owns its leadership while it leads."""

    elector: Elector
    identity: str
    owner: asyncio.Task[None] | None = None
    lead: Leadership | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    # Leaderships that were released or lost: none of them may be held again.
    ended: list[Leadership] = field(default_factory=list)
    # A campaign left waiting across steps (it wins when the leader lets go), and its outcome.
    waiter: asyncio.Task[None] | None = None
    waiter_won: asyncio.Future[Leadership | None] | None = None


class ElectionModel(RuleBasedStateMachine):
    """Electors of one election on one backend (set by the subclasses), driven one operation at a time."""

    backend = "memory"
    #: Whether the backend keeps one leader among the electors (the local backend does not).
    exclusive = True

    def __init__(self) -> None:
        super().__init__()
        self.fds_before = open_fds()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.mkdtemp(prefix="aioelect-model-")
        self.path = os.path.join(self.tmp, "election.lock")
        self.generation = 0
        self.slots = [self.new_slot(index) for index in range(SIZE)]

    # --- helpers -------------------------------------------------------------------------

    def new_elector(self, identity: str) -> Elector:
        if self.backend == "memory":
            return MemoryElector(name=NAME, identity=identity, stop_timeout=1.0)
        if self.backend == "local":
            return LocalElector(name=NAME, identity=identity, stop_timeout=1.0)
        return FileElector(self.path, name=NAME, identity=identity, stop_timeout=1.0)

    def new_slot(self, index: int) -> Slot:
        self.generation += 1
        identity = f"candidate-{index}-{self.generation}"
        return Slot(self.new_elector(identity), identity)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def holder(self) -> Slot | None:
        held = [slot for slot in self.slots if slot.lead is not None and slot.lead.held]
        return held[0] if held else None

    def waiting(self, me: Slot | None = None) -> list[Slot]:
        return [slot for slot in self.slots if slot is not me and slot.waiter is not None]

    def busy(self, slot: Slot) -> bool:
        return slot.owner is not None or slot.waiter is not None

    def settle(self) -> None:
        """Take in the outcome of waiting campaigns that ended (won, or failed) during the last steps."""
        for slot in self.slots:
            won = slot.waiter_won
            if slot.waiter is None or won is None or not won.done():
                continue
            waiter, slot.waiter, slot.waiter_won = slot.waiter, None, None
            lead = None if won.exception() is not None else won.result()
            if lead is None:
                self.run(self.drain(waiter))
                raise AssertionError(f"a waiting campaign ended without leadership: {won.exception()!r}")
            slot.owner, slot.lead = waiter, lead

    def handover(self) -> None:
        """After the leader let go, one waiting campaign (if any) must win, within a bounded time."""
        waiting = [slot.waiter_won for slot in self.waiting() if slot.waiter_won is not None]
        if not self.exclusive or not waiting or self.holder() is not None:
            return

        async def first() -> None:
            await asyncio.wait(waiting, timeout=WIN_WITHIN, return_when=asyncio.FIRST_COMPLETED)

        self.run(first())
        assert any(won.done() for won in waiting), "nobody took over from a waiting campaign after a release"
        self.settle()
        assert self.holder() is not None

    def others_lead(self, me: Slot) -> bool:
        if not self.exclusive:
            return False
        return any(slot is not me and slot.lead is not None and slot.lead.held for slot in self.slots)

    def forget(self, slot: Slot) -> None:
        if slot.lead is not None:
            slot.ended.append(slot.lead)
        slot.lead = None
        slot.owner = None
        slot.stop = asyncio.Event()

    async def finish_owner(self, slot: Slot) -> None:
        """Let the owning task end (its leadership is released when it does) and wait for it."""
        assert slot.owner is not None
        slot.stop.set()
        await asyncio.wait_for(asyncio.shield(slot.owner), WIN_WITHIN)

    def spawn(
        self, slot: Slot, *, once: bool, timeout: float
    ) -> tuple[asyncio.Task[None], asyncio.Future[Leadership | None]]:
        """Acquire in a task of our own that then holds the leadership until ``slot.stop`` is set."""
        won: asyncio.Future[Leadership | None] = self.loop.create_future()

        async def owner() -> None:
            try:
                lead = await slot.elector.try_acquire() if once else await slot.elector.acquire(timeout=timeout)
            except BaseException as exc:
                if not won.done():
                    won.set_exception(exc)
                raise
            won.set_result(lead)
            if lead is not None:
                await slot.stop.wait()

        return self.loop.create_task(owner()), won

    async def start_owner(self, slot: Slot, *, once: bool, timeout: float) -> Leadership | None:
        task, won = self.spawn(slot, once=once, timeout=timeout)
        try:
            lead = await asyncio.wait_for(asyncio.shield(won), timeout + WIN_WITHIN)
        except BaseException:
            await self.drain(task)
            raise
        if lead is None:
            await self.drain(task)
            return None
        slot.owner = task
        slot.lead = lead
        return lead

    def close_waiter(self, slot: Slot) -> None:
        """After aclose(): the waiting campaign ends (an error, or a leadership aclose() released)."""
        if slot.waiter is None or slot.waiter_won is None:
            return
        waiter, won = slot.waiter, slot.waiter_won
        slot.waiter, slot.waiter_won = None, None
        slot.stop.set()  # if it won before aclose(), its task holds on until told to end
        self.run(asyncio.wait_for(asyncio.gather(waiter, return_exceptions=True), WIN_WITHIN))
        lead = won.result() if won.done() and not won.cancelled() and won.exception() is None else None
        if lead is not None:
            assert not lead.held
            slot.ended.append(lead)

    async def drain(self, task: asyncio.Task[None]) -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    # --- operations ----------------------------------------------------------------------

    @rule(index=st.integers(0, SIZE - 1))
    def acquire(self, index: int) -> None:
        self.settle()
        slot = self.slots[index]
        if self.busy(slot):
            return  # this elector already leads: a second acquire is an error, tested elsewhere
        if self.others_lead(slot):
            # Someone else leads: a bounded acquire times out and leaves nothing behind.
            with pytest.raises(TimeoutError):
                self.run(self.start_owner(slot, once=False, timeout=LOSE_WITHIN))
            assert not slot.elector.leading
            return
        if self.waiting(slot):
            # Nobody leads but others wait: any of them may win first.
            try:
                self.run(self.start_owner(slot, once=False, timeout=LOSE_WITHIN))
            except TimeoutError:
                assert not slot.elector.leading
            return
        # Nobody else leads (possibly right after a release): acquire must succeed.
        lead = self.run(self.start_owner(slot, once=False, timeout=WIN_WITHIN))
        assert lead is not None and lead.held, "acquire failed although nobody else leads"
        assert slot.elector.leading

    @rule(index=st.integers(0, SIZE - 1))
    def try_acquire(self, index: int) -> None:
        self.settle()
        slot = self.slots[index]
        if self.busy(slot):
            return
        if self.others_lead(slot):
            assert self.run(self.start_owner(slot, once=True, timeout=LOSE_WITHIN)) is None
            assert not slot.elector.leading
            return
        # Nobody leads, but a release may still be letting go in the backend: then None is allowed.
        lead = self.run(self.start_owner(slot, once=True, timeout=LOSE_WITHIN))
        if lead is not None:
            assert lead.held and slot.elector.leading

    @rule(index=st.integers(0, SIZE - 1))
    def release(self, index: int) -> None:
        self.settle()
        slot = self.slots[index]
        if slot.lead is None:
            return
        lead = slot.lead
        self.run(asyncio.wait_for(lead.release(), WIN_WITHIN))
        assert not lead.held
        self.run(self.finish_owner(slot))
        self.forget(slot)
        assert not lead.held and not slot.elector.leading
        self.handover()

    @rule(index=st.integers(0, SIZE - 1))
    def end_owner(self, index: int) -> None:
        """The owning task returns: its leadership is released."""
        self.settle()
        slot = self.slots[index]
        if slot.lead is None:
            return
        lead = slot.lead
        self.run(self.finish_owner(slot))
        self.after_owner_ended(slot, lead)

    @rule(index=st.integers(0, SIZE - 1))
    def cancel_owner(self, index: int) -> None:
        self.settle()
        slot = self.slots[index]
        if slot.lead is None or slot.owner is None:
            return
        lead, owner = slot.lead, slot.owner
        owner.cancel()
        self.run(asyncio.gather(owner, return_exceptions=True))
        assert owner.cancelled()
        self.after_owner_ended(slot, lead)

    def after_owner_ended(self, slot: Slot, lead: Leadership) -> None:
        """The owner has ended: its leadership is no longer held, and a waiter may take over once the backend let go."""
        assert not lead.held
        # The release started when the task ended; release() waits until the backend has let go.
        self.run(asyncio.wait_for(lead.release(), WIN_WITHIN))
        self.forget(slot)
        assert not lead.held
        self.handover()

    @rule(index=st.integers(0, SIZE - 1))
    def campaign(self, index: int) -> None:
        """Start a campaign that stays waiting across the next steps while someone else leads."""
        self.settle()
        slot = self.slots[index]
        if self.busy(slot):
            return
        slot.waiter, slot.waiter_won = self.spawn(slot, once=False, timeout=600.0)
        self.run(asyncio.sleep(0.01))
        self.settle()

    @rule(index=st.integers(0, SIZE - 1))
    def cancel_waiter(self, index: int) -> None:
        """Cancel a waiting campaign: it leaves nothing behind (and whoever leads keeps leading)."""
        self.settle()
        slot = self.slots[index]
        if slot.waiter is None or slot.waiter_won is None:
            return
        waiter, won = slot.waiter, slot.waiter_won
        slot.waiter, slot.waiter_won = None, None
        waiter.cancel()
        self.run(asyncio.gather(waiter, return_exceptions=True))
        lead = won.result() if won.done() and not won.cancelled() and won.exception() is None else None
        if lead is not None:
            # It won just before the cancellation reached it: the leadership ends with the task.
            self.run(asyncio.wait_for(lead.release(), WIN_WITHIN))
            slot.ended.append(lead)
            self.handover()
        assert not slot.elector.leading

    @rule(index=st.integers(0, SIZE - 1))
    def aclose(self, index: int) -> None:
        self.settle()
        """Close the elector (releasing what it holds), then put a fresh one in its place."""
        slot = self.slots[index]
        lead = slot.lead
        self.run(asyncio.wait_for(slot.elector.aclose(), WIN_WITHIN))
        if lead is not None:
            assert not lead.held
        if slot.owner is not None:
            self.run(self.finish_owner(slot))
        self.close_waiter(slot)
        self.forget(slot)
        assert not slot.elector.leading
        self.handover()
        ended = slot.ended
        self.slots[index] = self.new_slot(index)
        self.slots[index].ended = ended

    @rule(index=st.integers(0, SIZE - 1))
    def leader(self, index: int) -> None:
        self.settle()
        slot = self.slots[index]
        seen = self.run(asyncio.wait_for(slot.elector.leader(), WIN_WITHIN))
        self.check_leader(slot, seen)

    @rule(index=st.integers(0, SIZE - 1))
    def observe(self, index: int) -> None:
        self.settle()
        slot = self.slots[index]

        async def first() -> str | None:
            async for current in slot.elector.observe():
                return current
            raise AssertionError("observe() ended without reporting")

        seen = self.run(asyncio.wait_for(first(), WIN_WITHIN))
        self.check_leader(slot, seen)

    def check_leader(self, slot: Slot, seen: str | None) -> None:
        if not self.exclusive:
            # A local elector reports itself while it leads, None otherwise.
            assert seen == (slot.identity if slot.elector.leading else None)
            return
        holder = self.holder()
        if holder is not None:
            assert seen == holder.identity
        elif self.backend == "memory":
            # A waiting campaign may win while the question is asked.
            assert seen is None or seen in {slot.identity for slot in self.waiting()}

    @rule(index=st.integers(0, SIZE - 1))
    def run_work(self, index: int) -> None:
        self.settle()
        slot = self.slots[index]
        if self.busy(slot):
            return
        ran: list[Leadership] = []

        async def work(value: int) -> int:
            lead = current_leadership()
            assert lead.held and slot.elector.leading
            ran.append(lead)
            await asyncio.sleep(0)
            return value * 2

        if self.waiting(slot) and not self.others_lead(slot):
            with contextlib.suppress(asyncio.TimeoutError):
                self.run(asyncio.wait_for(slot.elector.run(work, 21), LOSE_WITHIN))
        elif self.others_lead(slot):
            # asyncio.TimeoutError: not yet the built-in TimeoutError on Python 3.10.
            with pytest.raises(asyncio.TimeoutError):
                self.run(asyncio.wait_for(slot.elector.run(work, 21), LOSE_WITHIN))
            assert not ran
        else:
            assert self.run(asyncio.wait_for(slot.elector.run(work, 21), WIN_WITHIN)) == 42
            assert len(ran) == 1
        self.handover()
        slot.ended.extend(ran)
        assert not slot.elector.leading
        assert all(not lead.held for lead in ran)

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def one_leader(self) -> None:
        if not self.exclusive:
            return
        held = [slot.identity for slot in self.slots if slot.elector.leading]
        assert len(held) <= 1, f"several leaders at once: {held}"

    @invariant()
    def consistent(self) -> None:
        for slot in self.slots:
            assert all(not lead.held for lead in slot.ended), "a released or lost leadership is held again"
            if slot.waiter is not None:
                continue  # it may have won during the last step: taken in at the next one
            if slot.lead is None:
                assert not slot.elector.leading
            else:
                assert slot.elector.leading == slot.lead.held
                if not slot.lead.held:
                    assert slot.lead.lost  # held went False without a release: it must be a loss

    def teardown(self) -> None:
        try:
            for slot in self.slots:
                self.run(asyncio.wait_for(slot.elector.aclose(), WIN_WITHIN))
                self.close_waiter(slot)
                if slot.lead is not None:
                    assert not slot.lead.held
                if slot.owner is not None:
                    self.run(self.finish_owner(slot))
                self.forget(slot)
                assert all(not lead.held for lead in slot.ended)

            async def others() -> set[asyncio.Task[Any]]:
                await asyncio.sleep(0)
                return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}

            left = self.run(others())
            assert not left, f"tasks left behind: {left}"
            self.run(self.loop.shutdown_asyncgens())
            self.run(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
        leaked = open_fds() - self.fds_before
        # A descriptor number taken again for something else is not a leak: check what remains open.
        leaked = {fd for fd in leaked if os.path.exists(f"/proc/self/fd/{fd}")}
        assert not leaked, f"descriptors left open: {[os.readlink(f'/proc/self/fd/{fd}') for fd in leaked]}"


class MemoryModel(ElectionModel):
    backend = "memory"


class LocalModel(ElectionModel):
    # The local backend makes every elector leader at once (no mutual exclusion, by design):
    # only each elector's own consistency is checked there.
    backend = "local"
    exclusive = False


class FileModel(ElectionModel):
    backend = "file"


TestMemoryModel = MemoryModel.TestCase
TestMemoryModel.settings = MODEL_SETTINGS
TestLocalModel = LocalModel.TestCase
TestLocalModel.settings = MODEL_SETTINGS
TestFileModel = FileModel.TestCase
TestFileModel.settings = MODEL_SETTINGS
