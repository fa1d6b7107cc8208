"""How an etcd request failed: the exceptions the etcd modules raise to each other, and :func:`classify`.

Guarantees: every failure of a request becomes either :class:`Transient`
(a retry, perhaps on another endpoint, can fix it; it says whether etcd
answered and whether to fail over) or :class:`~aioelect.ElectionError`
(wrong credentials, permission denied: retrying cannot help), from the gRPC
status code and etcd's message. Anything else is not an etcd failure and is
left to propagate. Messages name the endpoint and the user, never a password.
"""

from __future__ import annotations

from typing import Any

import grpc

from ..._errors import ElectionError, PermanentBackendError
from ._endpoints import Endpoint

__all__ = ["MAX_TTL", "Compacted", "Retired", "SessionEnded", "Transient", "classify", "rpc_error"]

#: etcd refuses a lease longer than this ("too large lease TTL"; ``MaxLeaseTTL`` in etcd's lease package).
MAX_TTL = 9_000_000_000

# Server replies that a new client (a fresh auth token) or another member can fix.
_RETRYABLE_DETAILS = ("invalid auth token", "auth store is old", "not leader", "leader changed", "lease already exists")

# gRPC details of an UNAVAILABLE that a failed TLS handshake can explain.
_HANDSHAKE_HINTS = ("handshake", "tsi_", "ssl", "tls", "socket closed", "unwrap", "http1.x")


class Transient(Exception):
    """An etcd request failed in a way that a retry can fix.

    ``answered`` is True when an etcd member did answer (no quorum, lease not
    found...): etcd is reachable. ``rotate`` is True when the next request
    should go to another endpoint.
    """

    def __init__(self, message: str, *, answered: bool = False, rotate: bool = True, timed_out: bool = False) -> None:
        super().__init__(message)
        self.answered = answered
        self.rotate = rotate
        #: The request may have been applied: no answer came in time.
        self.timed_out = timed_out
        #: etcd says the lease the request used does not exist (any more).
        self.lease_gone = "requested lease not found" in message
        #: Our auth token expired: a new client (a new token) fixes it at once.
        self.reauth = "invalid auth token" in message or "auth store is old" in message
        #: gRPC could not set up the connection in a way a TLS problem can explain: worth a diagnosis.
        self.handshake = False


class Retired(Transient):
    """The channel a watch was using has been replaced: watch again on the new one."""

    def __init__(self) -> None:
        super().__init__("the etcd channel was replaced", rotate=False)


class Compacted(Transient):
    """The revision a watch or read started from has been compacted away."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"revision compacted (compact revision {revision})", answered=True, rotate=False)


class SessionEnded(Exception):
    """The session's lease may have expired: campaign again with a new session."""


def rpc_error(exc: BaseException) -> Any:
    """The grpc.aio.AioRpcError behind ``exc`` (raised by it, or the cause of what was raised), or None."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, grpc.aio.AioRpcError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def classify(exc: BaseException, what: str, endpoint: Endpoint, username: str | None) -> Exception | None:
    """Map a failed request to :class:`Transient` or :class:`ElectionError`; None: not an etcd failure (a bug)."""
    if isinstance(exc, (Transient, ElectionError)):
        return exc
    if isinstance(exc, TimeoutError):
        return Transient(f"{what} on {endpoint} timed out", timed_out=True)
    error = rpc_error(exc)
    if error is None:
        if isinstance(exc, OSError):
            return Transient(f"{what} on {endpoint} failed: {exc}")
        return None
    code = error.code()
    details = str(error.details() or code.name)
    etcd_said = details.removeprefix("etcdserver: ")
    if "authentication failed" in details:
        return PermanentBackendError(f"etcd at {endpoint} rejected the credentials of user {username!r}: {etcd_said}")
    if "too large lease TTL" in details:
        return PermanentBackendError(
            f"etcd at {endpoint} refused {what}: {etcd_said} (etcd grants leases of at most {MAX_TTL} seconds)"
        )
    if "user name is empty" in details:
        return PermanentBackendError(f"etcd at {endpoint} has authentication enabled: pass username and password")
    permanent = code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED) or (
        code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION)
        and not any(text in details for text in _RETRYABLE_DETAILS)
    )
    if permanent:
        return PermanentBackendError(f"etcd at {endpoint} refused {what}: {etcd_said}")
    answered = details.startswith("etcdserver:") or code in (
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    # A lease that is gone or a compacted revision is the same on every member.
    rotate = code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE)
    failure = Transient(f"{what} on {endpoint}: {code.name}: {details}", answered=answered, rotate=rotate)
    failure.handshake = code == grpc.StatusCode.UNAVAILABLE and any(h in details.lower() for h in _HANDSHAKE_HINTS)
    return failure
