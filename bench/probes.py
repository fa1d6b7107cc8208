"""One-shot measurements the driver runs in a fresh process: server round trips and cold starts.

``python -m bench.probes rtt --backend B --url U [--count N]``
    the median and spread of one trivial request to the server, on one
    connection kept open: ``SELECT 1`` through aiomysql (MariaDB) and asyncpg
    (PostgreSQL), the drivers aioelect uses, and a durable commit (an upsert of
    one row, autocommitted: InnoDB flushes its log, PostgreSQL with
    ``synchronous_commit=on``, as a fencing token's commit); on etcd a linearizable ``Range``
    and a ``Put`` (a write: it is committed through raft and fsynced, as a
    campaign's or a release's write is), over grpc-aio with the etcd API
    messages aioelect uses (``aetcd.rpc``); on Redis a ``PING`` and a ``SET``
    (on a server with ``appendfsync always``: fsynced before the reply, as a
    grant's token is) through redis-py's asyncio client, the one aioelect uses.

``python -m bench.probes coldstart --module M --url U --name NAME [--reps N]``
    for candidate module ``bench.candidates.M``: the time from constructing a
    new candidate (an aioelect elector, or a peer's client) through its
    connecting to its leading, in an empty election with a fresh name each
    repetition; then it releases and closes. One repetition first, not
    counted, so that lazily imported drivers do not weigh on the first.

``python -m bench.probes inproc --module M --url U --name NAME [--reps N]``
    a graceful handover between two candidates of module ``M`` in this one
    process: the leader releases while the other waits; the time from the
    release's start to the other's leading, and how long ``release()`` itself
    took. No other process has to be woken, so this is the implementation's own
    path, apart from the harness's process scheduling.

Each prints one JSON object on stdout; every request and repetition is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import statistics
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from .candidates._runner import Options

STEP_TIMEOUT = 20.0


async def _timed(op: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    for _ in range(min(10, count)):  # warm-up: connection set up, statement paths hot
        await asyncio.wait_for(op(), STEP_TIMEOUT)
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        await asyncio.wait_for(op(), STEP_TIMEOUT)
        out.append(time.perf_counter() - t0)
    return out


def _summary(xs: list[float]) -> dict[str, Any]:
    xs = sorted(xs)
    return {
        "median": statistics.median(xs),
        "p10": xs[len(xs) // 10],
        "p90": xs[(len(xs) * 9) // 10],
        "max": xs[-1],
        "count": len(xs),
    }


async def _rtt_mysql(url: str, count: int) -> dict[str, Any]:
    import aiomysql

    u = urllib.parse.urlsplit(url)
    conn = await aiomysql.connect(
        host=u.hostname,
        port=u.port or 3306,
        user=urllib.parse.unquote(u.username or "root"),
        password=urllib.parse.unquote(u.password or ""),
        db=u.path.lstrip("/") or None,
        autocommit=True,
    )
    try:
        async with conn.cursor() as cur:

            async def one() -> None:
                await cur.execute("SELECT 1")
                await cur.fetchone()

            async def commit() -> None:
                await cur.execute("INSERT INTO bench_rtt VALUES (1, 0) ON DUPLICATE KEY UPDATE v = v + 1")

            out = {"SELECT 1": _summary(await _timed(one, count))}
            if u.path.lstrip("/"):
                await cur.execute("CREATE TABLE IF NOT EXISTS bench_rtt (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
                out["commit"] = _summary(await _timed(commit, count))
            return out
    finally:
        conn.close()


async def _rtt_postgres(url: str, count: int) -> dict[str, Any]:
    import asyncpg

    conn = await asyncpg.connect(url, server_settings={"synchronous_commit": "on"})
    try:
        out = {"SELECT 1": _summary(await _timed(lambda: conn.fetchval("SELECT 1"), count))}
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_rtt (id int PRIMARY KEY, v int)")
        upsert = "INSERT INTO bench_rtt VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET v = bench_rtt.v + 1"
        out["commit"] = _summary(await _timed(lambda: conn.execute(upsert), count))
        return out
    finally:
        await asyncio.wait_for(conn.close(), 5)


async def _rtt_etcd(url: str, count: int) -> dict[str, Any]:
    import grpc
    from aetcd import rpc

    channel = grpc.aio.insecure_channel(url)
    try:
        kv = rpc.KVStub(channel)
        key = b"/bench/rtt"
        await kv.Put(rpc.PutRequest(key=key, value=b"x"), timeout=STEP_TIMEOUT)
        ranges = await _timed(lambda: kv.Range(rpc.RangeRequest(key=key), timeout=STEP_TIMEOUT), count)
        puts = await _timed(lambda: kv.Put(rpc.PutRequest(key=key, value=b"x"), timeout=STEP_TIMEOUT), count)
        return {"Range": _summary(ranges), "Put": _summary(puts)}
    finally:
        await channel.close()


async def _rtt_redis(url: str, count: int) -> dict[str, Any]:
    from redis.asyncio import Redis

    client = Redis.from_url(url, single_connection_client=True)
    try:
        pings = await _timed(lambda: client.ping(), count)
        sets = await _timed(lambda: client.set("bench:rtt", "x"), count)
        return {"PING": _summary(pings), "SET": _summary(sets)}
    finally:
        await asyncio.wait_for(client.aclose(), 5)


async def rtt(backend: str, url: str, count: int) -> dict[str, Any]:
    """Round trips of one trivial request per backend, on one open connection."""
    probe = {"mysql": _rtt_mysql, "postgres": _rtt_postgres, "etcd": _rtt_etcd, "redis": _rtt_redis}[backend]
    return await probe(url, count)


async def coldstart(module: str, url: str, name: str, reps: int, ttl: int, extra: dict[str, str]) -> dict[str, Any]:
    """Construct, connect and lead a fresh candidate in an empty election, ``reps`` times."""
    make = importlib.import_module(f"bench.candidates.{module}").make
    values: list[float] = []
    errors: list[str] = []
    for rep in range(reps + 1):
        options = Options(f"{name}/{rep}", url, 1, False, 20.0, ttl, None, extra)
        candidate = None
        try:
            t0 = time.perf_counter()
            candidate = make(options, 0)
            async with asyncio.timeout(STEP_TIMEOUT):  # this task campaigns: aioelect binds leading to it
                await candidate.setup()
                await candidate.campaign()
            took = time.perf_counter() - t0
            if rep:
                values.append(took)
            await asyncio.wait_for(candidate.release(), STEP_TIMEOUT)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
        finally:
            if candidate is not None:
                try:
                    await asyncio.wait_for(candidate.close(), STEP_TIMEOUT)
                except Exception as exc:
                    errors.append(f"close: {type(exc).__name__}: {exc}"[:200])
    return {"values": values, "errors": errors}


async def inproc(module: str, url: str, name: str, reps: int, ttl: int, extra: dict[str, str]) -> dict[str, Any]:
    """Graceful handovers between two candidates in one process, ``reps`` times.

    Each campaign runs in the task that later releases (aioelect binds a leadership to the task that
    acquired it): the leader in this task, the waiter in a task of its own that holds until told to release.
    """
    make = importlib.import_module(f"bench.candidates.{module}").make
    options = Options(name, url, 1, False, 20.0, ttl, None, extra)
    leader, follower = make(options, 0), make(options, 1)
    handovers: list[float] = []
    releases: list[float] = []
    errors: list[str] = []

    async def follow(led: asyncio.Event, done: asyncio.Event) -> None:
        await follower.campaign()
        led.set()
        await done.wait()
        await follower.release()

    try:
        for c in (leader, follower):
            await asyncio.wait_for(c.setup(), STEP_TIMEOUT)
        for rep in range(reps + 1):
            led, done = asyncio.Event(), asyncio.Event()
            async with asyncio.timeout(STEP_TIMEOUT):
                await leader.campaign()
            task = asyncio.ensure_future(follow(led, done))
            try:
                await asyncio.sleep(0.2)  # the follower waits on the server, not still connecting
                async with asyncio.timeout(STEP_TIMEOUT):
                    t0 = time.perf_counter()
                    await leader.release()
                    t1 = time.perf_counter()
                    await led.wait()
                    t2 = time.perf_counter()
                if rep:  # the first one sets up both candidates' sessions: not counted
                    handovers.append(t2 - t0)
                    releases.append(t1 - t0)
            finally:
                done.set()
                await asyncio.wait_for(task, STEP_TIMEOUT)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}"[:200])
    finally:
        for c in (leader, follower):
            try:
                await asyncio.wait_for(c.close(), STEP_TIMEOUT)
            except Exception as exc:
                errors.append(f"close: {type(exc).__name__}: {exc}"[:200])
    return {"values": handovers, "release": releases, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probes", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    p_rtt = sub.add_parser("rtt")
    p_rtt.add_argument("--backend", required=True, choices=("mysql", "postgres", "etcd", "redis"))
    p_rtt.add_argument("--url", required=True)
    p_rtt.add_argument("--count", type=int, default=200)
    for what in ("coldstart", "inproc"):
        p = sub.add_parser(what)
        p.add_argument("--module", required=True)
        p.add_argument("--url", required=True)
        p.add_argument("--name", required=True)
        p.add_argument("--reps", type=int, default=10)
        p.add_argument("--ttl", type=int, default=5)
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for a candidate")
    args = parser.parse_args()
    if args.what == "rtt":
        result = asyncio.run(rtt(args.backend, args.url, args.count))
    else:
        extra = dict(item.split("=", 1) for item in args.set)
        probe = coldstart if args.what == "coldstart" else inproc
        result = asyncio.run(probe(args.module, args.url, args.name, args.reps, args.ttl, extra))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
