"""Red team: fenced state on Redis with ``min_replicas`` is not confirmed on the replicas.

A grant and every renew count only once ``WAIT`` says every replica has them
(docs/guarantees.md, Redis Sentinel rows: "with min_replicas=N, a failover
keeps the key and the token"). The fenced state script is sent alone, with no
``WAIT``: a ``put`` the leader was told committed may be on no replica, and a
failover that keeps the token (so the next leader is legitimately elected)
loses the value. The next leader then reads the old value and redoes the work:
the exactly-once promise of docs/exactly-once.md breaks across a failover that
the token survives.
"""

from __future__ import annotations

import asyncio
import contextlib

import anyio

from aioelect import ElectionError, FencedStore, RedisElector

from .backends import unique_name
from .harness import RedisServer, TCPProxy

OPTIONS = {"lease": 3, "check_interval": 0.3, "check_timeout": 0.6, "renew_deadline": 2.0, "poll_interval": 0.5}


async def test_a_put_under_min_replicas_survives_a_failover_that_keeps_the_token() -> None:
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(RedisServer())
        link = TCPProxy("127.0.0.1", master.port)  # the replica's link to the master
        stack.callback(link.close)
        replica = stack.enter_context(RedisServer(replica_of=link.port))
        with anyio.fail_after(30):
            while "master_link_status:up" not in replica.command("INFO", "replication"):
                await asyncio.sleep(0.1)
        name = unique_name()
        async with RedisElector(master.url, name=name, identity="a", min_replicas=1, **OPTIONS) as a:  # type: ignore[arg-type]
            lead = await a.acquire(timeout=10)  # the grant is on the replica (WAIT)
            store = FencedStore(a)
            await store.put(lead, "last-tick", 6)
            await asyncio.sleep(0.3)  # replicated
            link.stall()  # the replica's link stays up on the master's side; no byte moves
            acknowledged = False
            with anyio.move_on_after(2.0), contextlib.suppress(ElectionError):
                await store.put(lead, "last-tick", 7)  # acknowledged: the tick is done
                acknowledged = True
            master.kill()  # the master dies before the link delivers; the replica is promoted
            link.drop()
            replica.command("REPLICAOF", "NO", "ONE")
            token = replica.command("GET", f"aioelect:{{{name}}}:token")
            value = replica.command("HGET", f"aioelect:{{{name}}}:state", "last-tick")
            print(f"MEASURED put acknowledged={acknowledged}, promoted replica token={token!r} value={value!r}")
            assert str(token) == str(lead.token), "the failover kept the token, as min_replicas promises"
            assert not acknowledged or value in ("7", b"7"), (
                f"a fenced put acknowledged under min_replicas=1 is not on the replica: after a failover that kept "
                f"the token the next leader reads last-tick={value!r} and runs tick 7 again"
            )


async def test_a_put_on_a_demoted_master_that_accepts_writes_is_refused() -> None:
    """The acquire script grants only on a master, because a replica with ``replica-read-only no`` accepts writes
    that no one else will ever see. The state script has no such check: a leader whose state connection still points
    at its demoted master (an operator's switch-over, Sentinel's reconfiguration of the old master) is told that its
    put committed, and the value is on no master."""
    with contextlib.ExitStack() as stack:
        old = stack.enter_context(RedisServer())
        new = stack.enter_context(RedisServer(replica_of=old.port))
        with anyio.fail_after(30):
            while "master_link_status:up" not in new.command("INFO", "replication"):
                await asyncio.sleep(0.1)
        name = unique_name()
        slow = {**OPTIONS, "lease": 20, "check_interval": 8.0, "renew_deadline": 15.0}  # no renew during the switch
        async with RedisElector(old.url, name=name, identity="a", volatile_tokens=True, **slow) as a:  # type: ignore[arg-type]
            lead = await a.acquire(timeout=10)
            store = FencedStore(a)
            await store.put(lead, "last-tick", 6)
            await asyncio.sleep(0.3)
            # A switch-over: the replica becomes the master, the old master its writable replica.
            new.command("REPLICAOF", "NO", "ONE")
            old.command("CONFIG", "SET", "replica-read-only", "no")
            old.command("REPLICAOF", "127.0.0.1", str(new.port))
            with anyio.fail_after(30):
                while "master_link_status:up" not in old.command("INFO", "replication"):
                    await asyncio.sleep(0.05)
            acknowledged = False
            try:
                with anyio.move_on_after(2.0):
                    await store.put(lead, "last-tick", 7)
                    acknowledged = True
            except ElectionError as exc:
                print(f"refused: {exc!r}")
            on_master = new.command("HGET", f"aioelect:{{{name}}}:state", "last-tick")
            print(f"MEASURED put on a demoted writable master acknowledged={acknowledged}, master holds {on_master!r}")
            assert not acknowledged or on_master in ("7", b"7"), (
                f"a fenced put was acknowledged by a replica: the master holds last-tick={on_master!r}"
            )
