"""A literal asyncio port of a minimal Go elector's ``etcdElector.Acquire``: the baseline.

Go's ``concurrency.NewSession(client, WithTTL(5))`` + ``NewElection(session,
pfx).Campaign(ctx, "scheduler")``, ported onto aetcd step by step: a lease
kept alive every TTL/3, a compare-and-put of ``pfx/<lease-hex>``, then
``waitDeletes`` (get the newest older key, watch it until deleted, repeat).
As in that elector:

* a failed campaign falls back to the local elector (it *leads*);
* once elected nothing is ever checked again (``session.Done()`` is ignored):
  the process acts as leader until it resigns (on context cancellation:
  ``Resign``, ``session.Close()`` which revokes the lease, ``client.Close()``).

One elector (client) is made per campaign, as the scheduler makes one per
start: that elector closes its client on release, so a second ``Acquire`` on
the same elector would fail and fall back to local leadership.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aetcd
from aetcd import rpc
from aetcd.utils import prefix_range_end

from ._runner import Candidate, Options, main


class Session:
    """``concurrency.Session``: a lease and its keep-alive loop (TTL/3, like Go's client)."""

    def __init__(self, client: aetcd.Client, lease: Any, ttl: int) -> None:
        self.client = client
        self.lease = lease
        self.ttl = ttl
        self.done = asyncio.Event()
        self.keepalive = asyncio.get_running_loop().create_task(self._keep_alive())

    @classmethod
    async def create(cls, client: aetcd.Client, ttl: int) -> Session:
        return cls(client, await client.lease(ttl), ttl)

    async def _keep_alive(self) -> None:
        try:
            while True:
                reply = await self.client.refresh_lease(self.lease.id)
                if reply is None or reply.TTL <= 0:
                    return  # lease gone: Go closes session.Done(); that elector never looks at it
                await asyncio.sleep(self.ttl / 3)
        except Exception:
            return
        finally:
            self.done.set()

    async def close(self) -> None:
        self.keepalive.cancel()
        with contextlib.suppress(Exception):
            await self.client.revoke_lease(self.lease.id)


class Election:
    """``concurrency.Election`` (Campaign / Resign only)."""

    def __init__(self, session: Session, pfx: str) -> None:
        self.session = session
        self.key_prefix = (pfx + "/").encode()
        self.leader_key = b""
        self.leader_rev = 0

    async def campaign(self, val: str) -> None:
        client = self.session.client
        lease_id = self.session.lease.id
        k = self.key_prefix + f"{lease_id:x}".encode()
        t = client.transactions
        succeeded, responses = await client.transaction(
            compare=[t.create(k) == 0], success=[t.put(k, val.encode(), lease=lease_id)], failure=[t.get(k)]
        )
        self.leader_key = k
        if succeeded:
            self.leader_rev = responses[0].response_put.header.revision
        else:
            self.leader_rev = responses[0][0][1].create_revision
        await self._wait_deletes(self.leader_rev - 1)

    async def _wait_deletes(self, max_create_rev: int) -> None:
        client = self.session.client
        while True:
            request = rpc.RangeRequest(
                key=self.key_prefix,
                range_end=prefix_range_end(self.key_prefix),
                sort_order=rpc.RangeRequest.DESCEND,
                sort_target=rpc.RangeRequest.CREATE,
                limit=1,
                max_create_revision=max_create_rev,
            )
            resp = await client.kvstub.Range(request, timeout=client._timeout, metadata=client.metadata)
            if not resp.kvs:
                return
            await self._wait_delete(resp.kvs[0].key, resp.header.revision)

    async def _wait_delete(self, key: bytes, rev: int) -> None:
        watch = await self.session.client.watch(key, start_revision=rev)
        try:
            async for event in watch:
                if event.kind == "DELETE":
                    return
        finally:
            await watch.cancel()

    async def resign(self) -> None:
        client = self.session.client
        t = client.transactions
        await client.transaction(
            compare=[t.create(self.leader_key) == self.leader_rev], success=[t.delete(self.leader_key)], failure=[]
        )


class BaselineEtcd(Candidate):
    def __init__(self, options: Options) -> None:
        host, _, port = options.url.rpartition(":")
        self.host, self.port = host, int(port)
        self.ttl = options.ttl
        self.pfx = options.name
        self.client: aetcd.Client | None = None
        self.session: Session | None = None
        self.election: Election | None = None
        self.leading = False

    async def campaign(self) -> None:
        self.client = aetcd.Client(host=self.host, port=self.port)  # newEtcdElector
        self.session = await Session.create(self.client, self.ttl)
        self.election = Election(self.session, self.pfx)
        # On a failed campaign that elector degrades to the local elector, which always leads.
        with contextlib.suppress(Exception):
            await self.election.campaign("scheduler")
        self.leading = True

    def acting(self) -> bool:
        return self.leading  # never checked again after Acquire returned

    async def release(self) -> None:
        self.leading = False
        client, session, election = self.client, self.session, self.election
        self.client = self.session = self.election = None
        try:
            if election is not None:
                with contextlib.suppress(Exception):
                    await election.resign()
            if session is not None:
                await session.close()
        finally:
            if client is not None:
                await client.close()


def make(options: Options, slot: int) -> Candidate:
    return BaselineEtcd(options)


if __name__ == "__main__":
    main(make)
