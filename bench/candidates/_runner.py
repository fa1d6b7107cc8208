"""The one protocol every benchmark candidate speaks, over stdin/stdout.

A candidate process hosts one or more *slots*; each slot is one candidate in
the election named ``--name`` (one slot per process for the fault scenarios,
many for the idle-cost scenario). Every line it prints is::

    <KIND> <slot> <monotonic-ns> [detail]

with ``time.monotonic_ns()`` taken in the candidate (CLOCK_MONOTONIC is
system-wide on Linux, so the driver compares it with its own clock):

``READY``      the slot exists (printed once per slot);
``PID``        detail = the pid to signal for this slot (a Go child for etcdctl);
``CAMPAIGN``   the slot starts campaigning;
``LEADER``     the implementation says this slot now leads;
``ACT``        heartbeat every ``--act-ms`` while the slot *acts as leader*,
               i.e. while the check its users would make says it leads;
``RELEASING``  a requested release starts (the slot stops acting at once);
``RELEASED``   the release returned;
``STOPPED``    the slot stopped acting as leader without being asked (loss);
``ERROR``      detail = what failed (the slot then idles).

Commands on stdin, one per line: ``release <slot>``, ``campaign <slot>``,
``add <n>`` (n more slots, which campaign at once), ``block <slot> <seconds>``
(a synchronous ``time.sleep`` on the event loop, between the lines ``BLOCK``
and ``WOKE``: the blocked-loop scenario), ``quit``. With
``--pingpong`` a slot that leads releases at once and campaigns again. With
``--spread`` slot *i* campaigns in election ``<name>/<i>`` instead of
``<name>`` (one process, many elections: the scale scenario).
End of stdin is ``quit``; the process always exits within a few seconds of it.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import dataclasses
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Candidate", "Options", "main"]


@dataclass
class Options:
    """What every candidate script is told on its command line."""

    name: str
    url: str
    slots: int
    pingpong: bool
    act_ms: float
    ttl: int
    lease: int | None
    extra: dict[str, str] = field(default_factory=dict)
    spread: bool = False


class Candidate(abc.ABC):
    """One candidate of one implementation, as the runner drives it."""

    async def setup(self) -> None:  # noqa: B027 - most candidates need nothing before campaigning
        """Prepare (connect...) before the first campaign."""

    @abc.abstractmethod
    async def campaign(self) -> None:
        """Return once the implementation says this candidate leads."""

    @abc.abstractmethod
    def acting(self) -> bool:
        """True while the implementation's own check says we still lead (what its users would look at)."""

    @abc.abstractmethod
    async def release(self) -> None:
        """Give leadership up the way the implementation's users do."""

    async def close(self) -> None:  # noqa: B027 - most candidates hold nothing between campaigns
        """Free what :meth:`setup` took."""

    def signal_pid(self) -> int:
        """The pid the driver signals (SIGKILL, SIGSTOP) to crash or freeze this candidate."""
        return os.getpid()


class RenewedLock(Candidate):
    """A peer's lock, renewed every ``ttl / 3`` by a loop beside the work, as the peers' docs recommend.

    It acts while every renewal succeeds; the first that fails or raises ends it.
    """

    lock: Any
    ttl: float
    held = False
    refresher: asyncio.Task[None] | None = None

    @abc.abstractmethod
    async def acquire(self) -> None:
        """Block until the peer's lock is ours."""

    @abc.abstractmethod
    async def renew(self) -> bool:
        """Renew the peer's lock; False (or an exception) if it is no longer ours."""

    async def campaign(self) -> None:
        await self.acquire()
        self.held = True
        self.refresher = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        with contextlib.suppress(Exception):
            while self.held:
                await asyncio.sleep(self.ttl / 3)
                if not await self.renew():
                    break
        self.held = False

    def acting(self) -> bool:
        return self.held

    async def release(self) -> None:
        self.held = False
        if self.refresher is not None:
            self.refresher.cancel()
            self.refresher = None
        await self.lock.release()


def _emit(kind: str, slot: int, detail: str = "", at: int | None = None) -> int:
    now = time.monotonic_ns() if at is None else at
    sys.stdout.write(f"{kind} {slot} {now}{' ' + detail if detail else ''}\n")
    sys.stdout.flush()
    return now


class _Slot:
    def __init__(self, index: int, candidate: Candidate, options: Options) -> None:
        self.index = index
        self.candidate = candidate
        self.options = options
        self.want_campaign = asyncio.Event()
        self.want_release = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        c = self.candidate
        try:
            await c.setup()
        except Exception as exc:
            _emit("ERROR", self.index, f"setup failed: {exc!r}".replace("\n", " "))
            return
        _emit("READY", self.index)
        period = self.options.act_ms / 1000.0
        while True:
            await self.want_campaign.wait()
            self.want_campaign.clear()
            self.want_release.clear()
            _emit("CAMPAIGN", self.index)
            try:
                await c.campaign()
            except Exception as exc:
                _emit("ERROR", self.index, f"campaign failed: {exc!r}".replace("\n", " "))
                continue
            _emit("PID", self.index, str(c.signal_pid()))
            _emit("LEADER", self.index)
            lost = False
            if self.options.pingpong:
                if c.acting():
                    _emit("ACT", self.index)
                self.want_release.set()
            while not self.want_release.is_set():
                # Stamp before checking: a freeze between the two must not date the check after the wake-up.
                stamp = time.monotonic_ns()
                if not c.acting():
                    lost = True
                    break
                _emit("ACT", self.index, at=stamp)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.want_release.wait(), period)
            if lost:
                _emit("STOPPED", self.index)
            else:
                _emit("RELEASING", self.index)
            try:
                await c.release()
            except Exception as exc:
                if not lost:
                    _emit("ERROR", self.index, f"release failed: {exc!r}".replace("\n", " "))
            if not lost:
                _emit("RELEASED", self.index)
            if self.options.pingpong:
                self.want_campaign.set()


async def _read_commands(slots: list[_Slot], spawn: Callable[[], _Slot]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = (await reader.readline()).decode().strip()
        if not line or line == "quit":
            return
        verb, _, arg = line.partition(" ")
        if verb == "add":
            for _ in range(int(arg)):
                spawn().want_campaign.set()
        elif verb == "block":
            index, _, seconds = arg.partition(" ")
            _emit("BLOCK", int(index), seconds)
            time.sleep(float(seconds))  # noqa: ASYNC251 - the application's synchronous call: the loop stops
            _emit("WOKE", int(index))
        elif verb in ("release", "campaign") and arg.isdigit() and int(arg) < len(slots):
            slot = slots[int(arg)]
            (slot.want_release if verb == "release" else slot.want_campaign).set()
        else:
            _emit("ERROR", -1, f"unknown command {line!r}")


async def _amain(factory: Callable[[Options, int], Candidate], options: Options) -> None:
    loop = asyncio.get_running_loop()
    # Blocking libraries (tooz) wait inside a thread per candidate: 100 idle ones need 100 threads.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=512))
    slots: list[_Slot] = []

    def spawn() -> _Slot:
        index = len(slots)
        own = dataclasses.replace(options, name=f"{options.name}/{index}") if options.spread else options
        slot = _Slot(index, factory(own, index), options)
        slots.append(slot)
        slot.task = loop.create_task(slot.run())
        return slot

    for _ in range(options.slots):
        spawn().want_campaign.set()
    try:
        await _read_commands(slots, spawn)
    finally:
        for slot in slots:
            if slot.task is not None:
                slot.task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(s.candidate.close() for s in slots), return_exceptions=True), timeout=3.0
            )


def main(factory: Callable[[Options, int], Candidate]) -> None:
    """Parse the common command line and run ``factory(options, slot)`` candidates until ``quit``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True, help="election / lock name")
    parser.add_argument("--url", required=True, help="server address (DSN, host:port or directory)")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--pingpong", action="store_true")
    parser.add_argument("--spread", action="store_true", help="slot i campaigns in election NAME/i")
    parser.add_argument("--act-ms", type=float, default=20.0)
    parser.add_argument("--ttl", type=int, default=5, help="etcd TTL / lock expiry in seconds")
    parser.add_argument("--lease", type=int, default=None, help="aioelect MySQL lease (default: library default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ns = parser.parse_args()
    extra = dict(item.split("=", 1) for item in ns.set)
    options = Options(ns.name, ns.url, ns.slots, ns.pingpong, ns.act_ms, ns.ttl, ns.lease, extra, ns.spread)
    # The baseline MySQL port leaks a connection per poll: let it reach the server's limit, not ours.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    del soft
    code = 0
    try:
        asyncio.run(_amain(factory, options))
    except KeyboardInterrupt:
        pass
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads blocked inside a library's acquire() cannot be interrupted: leave without joining them.
    os._exit(code)
