"""One aioelect candidate of ``python -m bench.handovers``, on any backend, with an identity (and a priority).

Speaks the line protocol of :mod:`bench.candidates._runner` (``KIND 0 MONOTONIC_NS [DETAIL]``, slot always 0):
``CAMPAIGN``, ``PID``, ``LEADER``, ``ACT`` every 20 ms while ``Leadership.held`` (stamped before the check),
``RELEASING`` when the leader work stops (a command, a SIGTERM or a step-down it was asked for), ``RELEASED``,
``STOPPED`` when leadership was lost, ``ERROR``.

Commands on stdin: ``release`` (``Leadership.release()``, what leaving ``async with leadership()`` does),
``stepdown IDENTITY`` (``Leadership.step_down(to=IDENTITY)``), ``campaign`` (campaign again after either),
``quit``. With ``--priority`` the candidate runs ``Elector.run(work)`` under ``aioelect.run()``, as a deployed
instance does: it campaigns again after a step-down it was asked for, and a SIGTERM stops the work and releases.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time

import aioelect

ACT_PERIOD = 0.02


def emit(kind: str, detail: str = "", at: int | None = None) -> int:
    now = time.monotonic_ns() if at is None else at
    sys.stdout.write(f"{kind} 0 {now}{' ' + detail if detail else ''}\n")
    sys.stdout.flush()
    return now


def elector(args: argparse.Namespace) -> aioelect.Elector:
    """The backend's elector with the main bench's settings (etcd TTL and Redis lease ``--ttl``), notes on."""
    if args.backend == "mysql":
        return aioelect.MySQLElector(args.url, name=args.name, identity=args.identity)
    if args.backend == "postgres":
        return aioelect.PostgresElector(args.url, name=args.name, identity=args.identity, schema="public")
    if args.backend == "etcd":
        return aioelect.EtcdElector([args.url], name=args.name, identity=args.identity, ttl=args.ttl)
    if args.backend == "redis":
        return aioelect.RedisElector(args.url, name=args.name, identity=args.identity, lease=args.ttl)
    path = os.path.join(args.url, args.name.strip("/").replace("/", "_") + ".lock")
    return aioelect.FileElector(path, name=args.name, identity=args.identity)


async def act_while_held(lead: aioelect.Leadership, stop: asyncio.Event | None = None) -> bool:
    """Print ``ACT`` while ``lead`` is held; False once it is not, True once ``stop`` is set."""
    while stop is None or not stop.is_set():
        stamp = time.monotonic_ns()  # before the check: a pause between the two cannot date the check later
        if not lead.held:
            return False
        emit("ACT", at=stamp)
        if stop is None:
            await asyncio.sleep(ACT_PERIOD)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ACT_PERIOD)
    return True


async def commanded(args: argparse.Namespace) -> None:
    """Campaign, lead until a command says how to let go, wait for ``campaign``; until ``quit``."""
    commands: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def read() -> None:
        while line := (await reader.readline()).decode().strip():
            await commands.put(line)
        await commands.put("quit")

    reading = loop.create_task(read())
    try:
        async with elector(args) as candidate:
            while True:
                emit("CAMPAIGN")
                lead = await candidate.acquire()
                emit("PID", str(os.getpid()))
                emit("LEADER", lead.identity)
                stop = asyncio.Event()
                command = loop.create_task(commands.get())
                command.add_done_callback(lambda _, stop=stop: stop.set())
                if not await act_while_held(lead, stop):
                    emit("STOPPED")
                    command.cancel()
                    await lead.release()
                else:
                    verb, _, target = (await command).partition(" ")
                    emit("RELEASING", verb)
                    if verb == "stepdown":
                        await lead.step_down(to=target, timeout=10)
                    else:
                        await lead.release()
                    emit("RELEASED")
                    if verb == "quit":
                        return
                while (line := await commands.get()) != "campaign":
                    if line == "quit":
                        return
    finally:
        reading.cancel()


async def deployed(args: argparse.Namespace) -> None:
    """A deployed instance: ``Elector.run(work)`` with a priority, until SIGTERM (``aioelect.run``)."""

    async def work() -> None:
        lead = aioelect.current_leadership()
        assert lead is not None
        emit("LEADER", lead.identity)
        try:
            if not await act_while_held(lead):
                emit("STOPPED")
                await asyncio.Event().wait()  # Elector.run cancels the work of a lost leadership, campaigns again
        finally:
            emit("RELEASING")  # the work stops here: cancelled by a SIGTERM or a step-down it was asked for

    async with elector(args) as candidate:
        candidate.set_priority(args.priority, settle=args.settle)
        # Ready as a deploy sees it: campaigning (with a priority, once it said it waits).
        candidate.add_listener(lambda event: emit("CAMPAIGN") if event.kind == "campaigning" else None)
        try:
            await candidate.run(work)
        finally:
            emit("RELEASED")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True, choices=("mysql", "postgres", "etcd", "redis", "file"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--ttl", type=int, default=5)
    parser.add_argument("--slots", type=int, default=1, help="always 1 (bench._driver passes it)")
    parser.add_argument("--priority", type=int, default=None)
    parser.add_argument("--settle", type=float, default=0.5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.priority is None:
        asyncio.run(commanded(args))
    else:
        with contextlib.suppress(SystemExit):
            aioelect.run(deployed(args))
        emit("EXIT")


if __name__ == "__main__":
    main()
