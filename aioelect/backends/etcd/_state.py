"""Fenced state on etcd: one transaction compares the leader key's create revision and writes.

A value lives at ``{name}\\0aioelect-state/{key}``: outside the election's
prefix ``{name}/`` (no campaign reads it as a candidate), inside the prefix
``{name}`` that an etcd role granted to the election covers.
"""

from __future__ import annotations

from aetcd import rpc

from ...core._backend import Hold, StateStore, Written
from ...core._errors import UsageError
from ._connection import Connection
from ._failures import Transient
from ._hold import EtcdHold

__all__ = ["EtcdStateStore", "state_key"]


def state_key(name: str, key: str) -> bytes:
    """The etcd key of fenced state ``key`` of election ``name``."""
    return f"{name}\0aioelect-state/{key}".encode()


class EtcdStateStore(StateStore):
    """Reads and fenced writes of one election's state, each one request on the election's connection."""

    def __init__(self, name: str, conn: Connection, request_timeout: float) -> None:
        self._name = name
        self._conn = conn
        self._timeout = request_timeout

    async def read(self, key: str) -> bytes | None:
        request = rpc.RangeRequest(key=state_key(self._name, key))
        try:
            reply = await self._conn.call(
                "read state", lambda ch: ch.kv.Range(request, metadata=ch.metadata), timeout=self._timeout
            )
        except Transient as exc:
            raise self._conn.failure(exc, "the state read") from None
        return bytes(reply.kvs[0].value) if reply.kvs else None

    async def post(self, key: str, value: bytes) -> None:
        request = rpc.PutRequest(key=state_key(self._name, key), value=value)
        try:
            await self._conn.call(
                "post request", lambda ch: ch.kv.Put(request, metadata=ch.metadata), timeout=self._timeout, attempts=1
            )
        except Transient as exc:
            raise self._conn.failure(exc, "the request") from None

    async def write(self, hold: Hold, key: str, value: bytes, *, compare: bool, expected: bytes | None) -> Written:
        if not isinstance(hold, EtcdHold):
            raise UsageError("a leadership taken while etcd was unreachable (degrade_to_local) cannot write state")
        where = state_key(self._name, key)
        checks = [
            rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=hold.key, create_revision=hold.token)
        ]
        if compare and expected is None:
            checks.append(
                rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=where, create_revision=0)
            )
        elif compare:
            checks.append(rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.VALUE, key=where, value=expected))
        request = rpc.TxnRequest(
            compare=checks,
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=where, value=value))],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=hold.key, keys_only=True))],
        )
        try:
            # One attempt: a transaction retried after a reply that never came could be refused for its own write.
            reply = await self._conn.call(
                "write state", lambda ch: ch.kv.Txn(request, metadata=ch.metadata), timeout=self._timeout, attempts=1
            )
        except Transient as exc:
            raise self._conn.failure(exc, "the fenced write") from None
        if reply.succeeded:
            return Written.DONE
        kvs = reply.responses[0].response_range.kvs
        if not kvs or int(kvs[0].create_revision) != hold.token:
            return Written.FENCED
        return Written.CONFLICT
