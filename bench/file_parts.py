"""``python -m bench.file_parts``: what each part of the file backend's campaign buys, measured by switching it off.

The file backend adds three things to a bare ``flock`` retry: the inotify
wait, the waiters' queue and the fork bookkeeping (see the docstring of
:mod:`aioelect.backends.file`). Each variant below runs with one or more of
them switched off through the backend's internals (only a measurement may
do that), so their worth is measured, not assumed:

* *handoffs*: two processes each acquire, release and acquire again for
  ``--seconds``; counted: leaderships that changed hands per second, how
  often the releaser won again, and the time from a release to the other
  process's leadership;
* *idle*: 100 candidates of one process wait for 5 s behind a leader of
  another process; measured: the CPU the waiting process used;
* *fork*: a leader forks a child that sleeps 3 s, then is killed; measured:
  how long a new candidate waits for the lock.

Results and their reading: ``bench/FILE_PARTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "everything": (True, True),
    "no inotify (polling)": (False, True),
    "no waiters' queue": (True, False),
    "neither": (False, False),
}


def _switch_off(inotify: bool, queue: bool, elector: object | None = None) -> None:
    from aioelect.backends.file import _inotify

    if not inotify:
        _inotify.libc = None
    if not queue and elector is not None:
        elector._file.handover = 0.0  # type: ignore[attr-defined]  # a new campaign never lets a waiter go first


def _candidate(path: str, inotify: bool, queue: bool, start_at: float, seconds: float, out: str) -> None:
    from aioelect import FileElector

    async def main() -> list[tuple[str, float]]:
        elector = FileElector(path)
        _switch_off(inotify, queue, elector)
        stamps: list[tuple[str, float]] = []
        await asyncio.sleep(max(0.0, start_at - time.time()))
        end = start_at + seconds
        try:
            while time.time() < end:
                try:
                    lead = await elector.acquire(timeout=max(0.01, end - time.time()))
                except TimeoutError:
                    break
                stamps.append(("lead", time.monotonic()))
                await lead.release()
                stamps.append(("release", time.monotonic()))
        finally:
            await elector.aclose()
        return stamps

    stamps = asyncio.run(main())
    with open(out, "w") as f:
        json.dump(stamps, f)


def handoffs(inotify: bool, queue: bool, seconds: float) -> str:
    directory = tempfile.mkdtemp(prefix="aioelect-bench-")
    path = os.path.join(directory, "x.lock")
    context = multiprocessing.get_context("spawn")
    start_at = time.time() + 3  # both processes imported and ready
    outs = [os.path.join(directory, f"{i}.json") for i in range(2)]
    procs = [context.Process(target=_candidate, args=(path, inotify, queue, start_at, seconds, out)) for out in outs]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(seconds + 30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    events = []
    for i, out in enumerate(outs):
        with open(out) as f:
            events += [(t, i, kind) for kind, t in json.load(f)]
    events.sort()
    leads = [(t, i) for t, i, kind in events if kind == "lead"]
    releases = {i: [t for t, j, kind in events if j == i and kind == "release"] for i in range(2)}
    changes, rewins, delays = 0, 0, []
    for (_, before), (t, who) in itertools.pairwise(leads):
        if who == before:
            rewins += 1
            continue
        changes += 1
        released = max((r for r in releases[before] if r <= t), default=None)
        if released is not None:
            delays.append(t - released)
    delays.sort()
    median = f"{1000 * delays[len(delays) // 2]:.1f} ms" if delays else "-"
    share = 100 * rewins / max(1, len(leads) - 1)
    return (
        f"{changes / seconds:.1f} handoffs/s, releaser re-won {share:.0f} % of {len(leads)} leaderships, "
        f"median handover {median}"
    )


def _idle_holder(path: str) -> None:
    from aioelect import FileElector

    async def main() -> None:
        await FileElector(path).acquire()  # held until the process is killed
        print("leading", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())


def idle(inotify: bool, count: int = 100, seconds: float = 5.0) -> str:
    from aioelect import FileElector

    _switch_off(inotify, True)
    path = os.path.join(tempfile.mkdtemp(prefix="aioelect-bench-"), "x.lock")
    code = f"from bench.file_parts import _idle_holder; _idle_holder({path!r})"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        holder.stdout.readline()

        async def wait() -> float:
            electors = [FileElector(path, identity=f"c{i}") for i in range(count)]
            tasks = [asyncio.ensure_future(e.acquire()) for e in electors]
            await asyncio.sleep(1.0)  # every candidate is waiting
            cpu = time.process_time()
            await asyncio.sleep(seconds)
            cpu = time.process_time() - cpu
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for elector in electors:
                await elector.aclose()
            return cpu

        cpu = asyncio.run(wait())
    finally:
        holder.kill()
        holder.wait(30)
        from aioelect.backends.file import _inotify

        _inotify.libc = _inotify._load()
    return f"{count} waiting candidates used {100 * cpu / seconds:.2f} % of a core"


def _fork_holder(path: str, bookkeeping: bool) -> None:
    from aioelect.backends.file import _fork

    if not bookkeeping:
        _fork.track = lambda owner: None  # nothing is closed in a forked child
    from aioelect import FileElector

    async def main() -> None:
        await FileElector(path).acquire()  # held until the process dies
        if os.fork() == 0:
            time.sleep(3)  # noqa: ASYNC251 - the forked child runs no event loop
            os._exit(0)
        print("forked", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())


def fork(bookkeeping: bool) -> str:
    from aioelect import FileElector

    path = os.path.join(tempfile.mkdtemp(prefix="aioelect-bench-"), "x.lock")
    code = f"from bench.file_parts import _fork_holder; _fork_holder({path!r}, {bookkeeping!r})"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert holder.stdout is not None
    holder.stdout.readline()
    holder.wait(30)

    async def take() -> float:
        elector = FileElector(path)
        started = time.monotonic()
        lead = await elector.acquire(timeout=30)
        took = time.monotonic() - started
        await lead.release()
        await elector.aclose()
        return took

    took = asyncio.run(take())
    time.sleep(3)  # the child is gone
    return f"takeover after the leader's death: {took:.3f} s"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.file_parts", description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each handoff run")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    for name, (inotify, queue) in VARIANTS.items():
        for _ in range(args.reps):
            print(f"handoffs, {name}: {handoffs(inotify, queue, args.seconds)}", flush=True)
    for inotify in (True, False):
        print(f"idle, {'inotify' if inotify else 'polling'}: {idle(inotify)}", flush=True)
    for bookkeeping in (True, False):
        print(f"fork, bookkeeping {'on' if bookkeeping else 'off'}: {fork(bookkeeping)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
