"""How an etcd request failed: the exceptions the etcd modules raise to each other, and :func:`classify`.

Guarantees: every failure of a request becomes either :class:`Transient`
(a retry, perhaps on another endpoint, can fix it; it says whether etcd
answered and whether to fail over) or :class:`~aioelect.ElectionError`
(wrong credentials, permission denied: retrying cannot help), from the gRPC
status code and etcd's message. Anything else is not an etcd failure and is
left to propagate. Messages name the endpoint and the user, never a password.
"""

from __future__ import annotations

import enum
from typing import Any

import grpc

from ...core._errors import ElectionError, PermanentBackendError
from ._endpoints import Endpoint

__all__ = [
    "MAX_TTL",
    "Compacted",
    "Failure",
    "Retired",
    "SessionEnded",
    "Transient",
    "answered",
    "classify",
    "rpc_error",
]

#: etcd refuses a lease longer than this ("too large lease TTL"; ``MaxLeaseTTL`` in etcd's lease package).
MAX_TTL = 9_000_000_000

# Server replies that a new client (a fresh auth token) or another member can fix.
_RETRYABLE_DETAILS = ("invalid auth token", "auth store is old", "not leader", "leader changed", "lease already exists")

# gRPC details of an UNAVAILABLE that a failed TLS handshake can explain.
_HANDSHAKE_HINTS = ("handshake", "tsi_", "ssl", "tls", "socket closed", "unwrap", "http1.x")


class Failure(enum.Enum):
    """How a request that a retry can fix failed: decided once, where the error is caught.

    Each says whether an etcd member answered (etcd is reachable) and
    whether the next request should go to another endpoint.
    """

    #: No member answered (connection refused or reset, stream closed by the peer).
    UNREACHABLE = "unreachable"
    #: No member answered, in a way a TLS problem can explain: worth a diagnosis.
    HANDSHAKE = "handshake failed"
    #: No answer came in time: the request may have been applied.
    TIMED_OUT = "timed out"
    #: A member answered with an error that a retry, or another member, can fix (no quorum, not leader...).
    REFUSED = "refused"
    #: Our auth token expired: a new client (a new token) fixes it at once.
    REAUTH = "auth token expired"
    #: etcd says the lease the request used does not exist (any more): the same on every member.
    LEASE_GONE = "lease gone"
    #: A member answered with what every member would (a compacted revision): no failing over.
    SAME_EVERYWHERE = "same on every member"
    #: We closed or replaced the channel or stream: not the endpoint's fault.
    STREAM_ENDED = "stream ended"

    @property
    def answered(self) -> bool:
        return self in (Failure.REFUSED, Failure.REAUTH, Failure.LEASE_GONE, Failure.SAME_EVERYWHERE)

    @property
    def rotate(self) -> bool:
        return self not in (Failure.LEASE_GONE, Failure.SAME_EVERYWHERE, Failure.STREAM_ENDED)


def answered(details: str, *, rotate: bool = True) -> Failure:
    """The failure of a request a member answered with ``details`` (its error text, read where it was caught)."""
    if "requested lease not found" in details:
        return Failure.LEASE_GONE
    if "invalid auth token" in details or "auth store is old" in details:
        return Failure.REAUTH
    return Failure.REFUSED if rotate else Failure.SAME_EVERYWHERE


class Transient(Exception):
    """An etcd request failed in a way that a retry can fix; ``failure`` says how (:class:`Failure`)."""

    def __init__(self, message: str, failure: Failure = Failure.UNREACHABLE) -> None:
        super().__init__(message)
        self.failure = failure

    @property
    def answered(self) -> bool:
        """An etcd member did answer (no quorum, lease not found...): etcd is reachable."""
        return self.failure.answered

    @property
    def rotate(self) -> bool:
        """The next request should go to another endpoint."""
        return self.failure.rotate

    @property
    def timed_out(self) -> bool:
        """The request may have been applied: no answer came in time."""
        return self.failure is Failure.TIMED_OUT

    @property
    def lease_gone(self) -> bool:
        """etcd says the lease the request used does not exist (any more)."""
        return self.failure is Failure.LEASE_GONE

    @property
    def reauth(self) -> bool:
        """Our auth token expired: a new client (a new token) fixes it at once."""
        return self.failure is Failure.REAUTH

    @property
    def handshake(self) -> bool:
        """gRPC could not set up the connection in a way a TLS problem can explain: worth a diagnosis."""
        return self.failure is Failure.HANDSHAKE


class Retired(Transient):
    """The channel a watch was using has been replaced: watch again on the new one."""

    def __init__(self) -> None:
        super().__init__("the etcd channel was replaced", Failure.STREAM_ENDED)


class Compacted(Transient):
    """The revision a watch or read started from has been compacted away."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"revision compacted (compact revision {revision})", Failure.SAME_EVERYWHERE)


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
        return Transient(f"{what} on {endpoint} timed out", Failure.TIMED_OUT)
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
    message = f"{what} on {endpoint}: {code.name}: {details}"
    if details.startswith("etcdserver:") or code in (
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ):
        # A lease that is gone or a compacted revision is the same on every member.
        rotate = code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE)
        return Transient(message, answered(details, rotate=rotate))
    if code == grpc.StatusCode.UNAVAILABLE and any(h in details.lower() for h in _HANDSHAKE_HINTS):
        return Transient(message, Failure.HANDSHAKE)
    return Transient(message, Failure.UNREACHABLE)
