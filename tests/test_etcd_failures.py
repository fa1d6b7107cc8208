"""How a failed etcd request is classified, once, where it is caught (no server: gRPC errors built here)."""

from __future__ import annotations

import grpc
import pytest

from aioelect import PermanentBackendError
from aioelect.backends.etcd._endpoints import parse_endpoints
from aioelect.backends.etcd._failures import Failure, Transient, classify

ENDPOINT = parse_endpoints("127.0.0.1:2379")[0]


def _rpc(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize(
    ("error", "failure", "answered", "rotate"),
    [
        (TimeoutError(), Failure.TIMED_OUT, False, True),
        (ConnectionResetError("reset"), Failure.UNREACHABLE, False, True),
        (_rpc(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"), Failure.UNREACHABLE, False, True),
        (_rpc(grpc.StatusCode.UNAVAILABLE, "Ssl handshake failed"), Failure.HANDSHAKE, False, True),
        (_rpc(grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader"), Failure.REFUSED, True, True),
        (_rpc(grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token"), Failure.REAUTH, True, True),
        (_rpc(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found"), Failure.LEASE_GONE, True, False),
        (
            _rpc(grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted"),
            Failure.SAME_EVERYWHERE,
            True,
            False,
        ),
    ],
)
def test_a_transient_failure_is_one_kind(error: Exception, failure: Failure, answered: bool, rotate: bool) -> None:
    found = classify(error, "read leader", ENDPOINT, None)
    assert isinstance(found, Transient) and found.failure is failure
    assert (found.answered, found.rotate) == (answered, rotate)
    assert found.lease_gone is (failure is Failure.LEASE_GONE)
    assert found.reauth is (failure is Failure.REAUTH)
    assert found.handshake is (failure is Failure.HANDSHAKE)
    assert found.timed_out is (failure is Failure.TIMED_OUT)


def test_a_permanent_refusal_is_a_permanent_backend_error() -> None:
    found = classify(_rpc(grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied"), "put", ENDPOINT, "u")
    assert isinstance(found, PermanentBackendError)
