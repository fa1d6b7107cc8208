"""One elector's connection to etcd, and its sessions.

:class:`Connection` owns the elector's single aetcd client and fails over
between endpoints; :class:`Session` is a lease kept alive in the background,
following etcd's Go ``client/v3/concurrency`` ``Session``: the session ends
as soon as the lease may have expired. Every session of a connection renews
its lease on the connection's one long-lived ``LeaseKeepAlive`` stream
(:class:`KeepAliveStream`, as Go's lessor): opening a stream per keep-alive
cost more than the keep-alive itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import logging
import os
import secrets
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio

from ..._backend import Backoff, Confirm, monotonic
from ..._config import is_loopback, transport_warning
from ..._errors import ElectionError
from ..._log import ElectionLog

try:
    import aetcd
    import grpc
    from aetcd import rpc
    from aetcd import watcher as aetcd_watcher
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the etcd backend needs aetcd: pip install 'aioelect[etcd]'") from exc

__all__ = [
    "Compacted",
    "Connection",
    "Endpoint",
    "EtcdTLS",
    "KeepAliveStream",
    "Retired",
    "Session",
    "SessionEnded",
    "Transient",
    "WatchStream",
    "first_of",
    "parse_endpoints",
    "settle",
]

T = TypeVar("T")

# gRPC keepalive pings detect a dead or frozen member under a long-lived watch.
# etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
GRPC_OPTIONS = {
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.http2.max_pings_without_data": 0,
    "grpc.max_reconnect_backoff_ms": 1_000,
}
#: How long :meth:`Connection.aclose` lets requests in flight finish before closing under them.
DRAIN_TIMEOUT = 1.0

# Server replies that a new client (a fresh auth token) or another member can fix.
_RETRYABLE_DETAILS = ("invalid auth token", "auth store is old", "not leader", "leader changed", "lease already exists")


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
    """The client a watch was using has been replaced: watch again on the new one."""

    def __init__(self) -> None:
        super().__init__("the etcd client was replaced", rotate=False)


class Compacted(Transient):
    """The revision a watch or read started from has been compacted away."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"revision compacted (compact revision {revision})", answered=True, rotate=False)


class SessionEnded(Exception):
    """The session's lease may have expired: campaign again with a new session."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    #: "http" or "https" when the endpoint was given with a scheme, else None.
    scheme: str | None = None

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


#: The port of an endpoint given without one.
DEFAULT_PORT = 2379


def parse_endpoints(endpoints: str | Sequence[str]) -> list[Endpoint]:
    """Parse ``host:port``, ``http://host:port`` or ``https://host:port`` (a list or one comma-separated string).

    An endpoint given with a scheme keeps it in :attr:`Endpoint.scheme`.
    Every endpoint is reached the same way: ``https://`` on some endpoints
    and not on others (``http://`` or no scheme) is a ValueError, never
    plain HTTP to some or all of them.
    """
    if isinstance(endpoints, str):
        items = endpoints.split(",")
    elif isinstance(endpoints, Sequence) and all(isinstance(e, str) for e in endpoints):
        items = list(endpoints)
    else:
        raise ValueError("endpoints must be a list of 'host:port' strings or one comma-separated string")
    parsed: list[Endpoint] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        scheme = item.split("://", 1)[0].lower() if "://" in item else None
        if scheme not in (None, "http", "https"):
            raise ValueError(f"endpoint {item!r}: the scheme must be http or https, not {scheme!r}")
        parts = urlsplit(item if "://" in item else "//" + item)
        if parts.username is not None or parts.password is not None:
            raise ValueError("endpoints must not carry credentials: pass username and password instead")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"endpoint {item!r} must be host:port, without a path")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"endpoint {item!r}: the port must be a number from 1 to 65535") from None
        if not parts.hostname:
            raise ValueError(f"endpoint {item!r} has no host")
        parsed.append(Endpoint(parts.hostname, port or DEFAULT_PORT, scheme))
    if not parsed:
        raise ValueError("at least one etcd endpoint is needed")
    if len({e.scheme == "https" for e in parsed}) > 1:
        plain = next(e for e in parsed if e.scheme != "https")
        raise ValueError(
            f"endpoints mix http:// and https://: {plain} is plain HTTP ({'http://' if plain.scheme else 'no scheme'}) "
            "beside https:// endpoints; every member of one cluster is reached the same way: write https:// on each"
        )
    return parsed


def _no_passphrase() -> str:
    raise ValueError("the private key is encrypted; gRPC needs an unencrypted PEM key")


# Where distributions keep their CA bundle, after OpenSSL's own default (which honours SSL_CERT_FILE).
_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")


@dataclass(frozen=True)
class EtcdTLS:
    """TLS to etcd: the server verified against ``ca_file`` (else the system CAs), optional client certificate.

    Files are checked when this is built (:meth:`load`) and read again for
    each new gRPC channel, so renewed certificates are used from the next
    reconnect on.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def load(cls, ca_file: str | None, cert_file: str | None, key_file: str | None) -> EtcdTLS:
        """Check the files (exist, parse, key matches certificate); raise ValueError saying which is wrong."""
        paths: dict[str, str | None] = {}
        for option, value in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
            if value is not None:
                if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
                    raise ValueError(f"{option} must be a file path")
                value = os.fspath(value)
                if not os.path.isfile(value):
                    raise ValueError(f"{option} {value!r} does not exist or is not a file")
            paths[option] = value
        tls = cls(**paths)
        if (tls.cert_file is None) != (tls.key_file is None):
            raise ValueError("cert_file and key_file go together: pass both (a PEM certificate and its key) or neither")
        tls.context()  # parses every file now: a bad one is a ValueError at construction, not a late surprise
        return tls

    def context(self) -> ssl.SSLContext:
        """An :class:`ssl.SSLContext` equivalent to the gRPC credentials (used to diagnose failed handshakes)."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"ca_file {self.ca_file!r} holds no usable PEM CA certificate: {exc}") from None
        if self.cert_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load the client certificate {self.cert_file!r}: {exc}") from None
        context.set_alpn_protocols(["h2"])
        return context

    def _roots(self) -> bytes | None:
        if self.ca_file is not None:
            return _read(self.ca_file, "ca_file")
        # gRPC would use its own bundled roots; the system's are what users expect and manage.
        for path in (ssl.get_default_verify_paths().cafile, *_CA_BUNDLES):
            if path and os.path.isfile(path):
                return _read(path, "the system CA bundle")
        return None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files as they are now; ElectionError if one cannot be read."""
        return grpc.ssl_channel_credentials(
            root_certificates=self._roots(),
            private_key=_read(self.key_file, "key_file") if self.key_file is not None else None,
            certificate_chain=_read(self.cert_file, "cert_file") if self.cert_file is not None else None,
        )

    def describe(self) -> str:
        parts = [f"ca_file={self.ca_file}" if self.ca_file else "system CAs"]
        if self.cert_file:
            parts.append(f"client certificate {self.cert_file}")
        return "TLS (" + ", ".join(parts) + ")"


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise ElectionError(f"cannot read {what} {path!r}: {exc.strerror}") from None


class _Client(aetcd.Client):  # type: ignore[misc]
    """aetcd's client on a channel of our making: a TLS one when given credentials.

    aetcd 1.0 can only open insecure channels (its issue 37), so
    :meth:`connect` does what aetcd 1.0's does (channel, authentication,
    stubs) with a channel created here; every other method of the client
    works on it as before. Our :class:`Connection` makes a new client for
    each (re)connection, so every reconnection and failover is TLS too.
    """

    def __init__(self, host: str, port: int, *, credentials: grpc.ChannelCredentials | None, **kwargs: Any) -> None:
        super().__init__(host, port, **kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        target = f"[{self._host}]:{self._port}" if ":" in self._host else f"{self._host}:{self._port}"
        options = list(self._options.items())
        if self._credentials is None:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        else:
            self.channel = grpc.aio.secure_channel(target, self._credentials, options=options)
        if self._username is not None and self._password is not None:
            self.auth_stub = rpc.AuthStub(self.channel)
            request = rpc.AuthenticateRequest(name=self._username, password=self._password)
            reply = await self.auth_stub.Authenticate(request, timeout=self._timeout)
            self.metadata = (("token", reply.token),)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        watch = rpc.WatchStub(self.channel)
        self._watcher = aetcd_watcher.Watcher(watch, timeout=self._timeout, metadata=self.metadata)
        self._connected.set()


# --- why a connection failed ------------------------------------------------------------------

# An HTTP/2 client preface and an empty SETTINGS frame: any gRPC server answers with its own SETTINGS.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HANDSHAKE_HINTS = ("handshake", "tsi_", "ssl", "tls", "socket closed", "unwrap", "http1.x")


def _speaks_h2(sock: socket.socket) -> bool:
    """True if the peer answers an HTTP/2 preface with a SETTINGS frame, as gRPC servers do."""
    sock.sendall(_H2_PREFACE)
    data = b""
    while len(data) < 4:
        chunk = sock.recv(9 - len(data))
        if not chunk:
            return False
        data += chunk
    return data[3] == 0x04


def _client_cert_refused(reason: str) -> bool:
    reason = reason.upper()
    return "ALERT" in reason and any(t in reason for t in ("CERTIFICATE", "UNKNOWN_CA", "ACCESS_DENIED"))


def diagnose_tls(endpoint: Endpoint, tls: EtcdTLS | None, timeout: float) -> str | None:
    """Why a connection to ``endpoint`` can never work as configured, found by a handshake of our own; else None.

    gRPC reports every failed connection as UNAVAILABLE with terse details
    ("Socket closed", "Unwrap failed"), alike for a dying server and a
    refused certificate. A refused certificate, a server that does not speak
    TLS (or that requires it) will never work and must not be retried; all
    else (refused connection, timeout, reset) returns None: transient.
    Blocking, each step bounded by ``timeout``: run it in a thread.
    """
    address = (endpoint.host, endpoint.port)
    where = f"etcd at {endpoint}"

    def plain_h2() -> bool:
        try:
            with socket.create_connection(address, timeout=timeout) as raw:
                return _speaks_h2(raw)
        except OSError:
            return False

    if tls is None:
        if plain_h2():
            return None
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        try:
            with socket.create_connection(address, timeout=timeout) as raw, insecure.wrap_socket(raw):
                pass
        except ssl.SSLError as exc:
            if "ALERT" not in str(exc.reason).upper():
                return None
        except OSError:
            return None
        return (
            f"{where} requires TLS: use https:// endpoints (with ca_file, and cert_file/key_file if it "
            "runs with --client-cert-auth)"
        )

    try:
        context = tls.context()
    except ValueError as exc:  # a file changed since construction
        return str(exc)
    trust = f"ca_file {tls.ca_file}" if tls.ca_file else "the system CAs"
    try:
        with socket.create_connection(address, timeout=timeout) as raw:
            try:
                with context.wrap_socket(raw, server_hostname=endpoint.host) as conn:
                    # TLS 1.3: the server judges our certificate after the handshake, and says so on the first read.
                    _speaks_h2(conn)
                    return None
            except ssl.SSLCertVerificationError as exc:
                return (
                    f"TLS: {where} presented a certificate that {trust} does not accept "
                    f"({exc.verify_message}); check ca_file and that the certificate names {endpoint.host}"
                )
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError, BrokenPipeError):
                pass  # closed on us: does it speak plain HTTP/2 instead? See below.
            except ssl.SSLError as exc:
                reason = str(exc.reason or exc)
                if _client_cert_refused(reason):
                    if tls.cert_file is None:
                        return (
                            f"TLS: {where} requires a client certificate (it runs with --client-cert-auth): "
                            f"pass cert_file and key_file ({reason})"
                        )
                    return (
                        f"TLS: {where} refused our client certificate {tls.cert_file} ({reason}): it must be "
                        "signed by a CA in etcd's --trusted-ca-file"
                    )
                if "ALERT" in reason.upper():
                    return f"TLS: {where} refused the handshake ({reason})"
    except OSError:
        return None  # refused, unreachable, timed out: nothing to say about TLS
    if plain_h2():
        return (
            f"TLS: {where} does not speak TLS (it answered in plain HTTP/2): use http:// endpoints, "
            "without ca_file/cert_file/key_file"
        )
    return None


async def settle(awaitable: Awaitable[T]) -> T:
    """Await a gRPC call (or anything that awaits one) safely.

    grpc.aio turns a cancellation it receives into a CancelledError of its
    own, which anyio cancel scopes (timeouts, task groups) do not recognise as
    theirs and let through. So the call runs in a helper task and we only wait
    for it: cancelling us raises our own CancelledError and cancels the call.
    A call cancelled under us (its client closed) raises :class:`Transient`.
    """
    inner = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait([inner])
    except BaseException:
        inner.cancel()
        inner.add_done_callback(_consume)
        raise
    if inner.cancelled():
        raise Transient("the etcd request was cancelled (client closed)")
    return inner.result()


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _time_out(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


async def first_of(*waiters: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    """Run ``waiters`` concurrently; return (index, result) of the first to finish, cancelling the rest.

    If the first to finish raised, that exception is raised (never an exception group).
    """
    outcome: list[tuple[int, Any, BaseException | None]] = []

    async def run(index: int, waiter: Callable[[], Awaitable[Any]], tg: anyio.abc.TaskGroup) -> None:
        try:
            value = await waiter()
        except Exception as exc:
            outcome.append((index, None, exc))
        else:
            outcome.append((index, value, None))
        tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        for index, waiter in enumerate(waiters):
            tg.start_soon(run, index, waiter, tg)
    index, value, error = outcome[0]
    if error is not None:
        raise error
    return index, value


def _rpc_error(exc: BaseException) -> Any:
    """The grpc.aio.AioRpcError behind ``exc`` (aetcd wraps them), or None."""
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
    error = _rpc_error(exc)
    if error is None:
        if isinstance(exc, (OSError, aetcd.ClientError)):
            return Transient(f"{what} on {endpoint} failed: {exc}")
        return None
    code = error.code()
    details = str(error.details() or code.name)
    etcd_said = details.removeprefix("etcdserver: ")
    if "authentication failed" in details:
        return ElectionError(f"etcd at {endpoint} rejected the credentials of user {username!r}: {etcd_said}")
    if "user name is empty" in details:
        return ElectionError(f"etcd at {endpoint} has authentication enabled: pass username and password")
    permanent = code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED) or (
        code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION)
        and not any(text in details for text in _RETRYABLE_DETAILS)
    )
    if permanent:
        return ElectionError(f"etcd at {endpoint} refused {what}: {etcd_said}")
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


class _Channel:
    """One aetcd client (one gRPC channel to one endpoint) and who is using it."""

    def __init__(self, client: Any, endpoint: Endpoint) -> None:
        self.client = client
        self.endpoint = endpoint
        self.kv: Any = client.kvstub
        self.lease: Any = client.leasestub
        self.watch: Any = rpc.WatchStub(client.channel)
        self.metadata: Any = client.metadata
        self.users = 0
        self.retired = anyio.Event()
        self.closed = False
        #: The one LeaseKeepAlive stream every session of the connection renews its lease on.
        self.keepalives: KeepAliveStream | None = None


class KeepAliveStream:
    """One long-lived ``LeaseKeepAlive`` stream on one channel, shared by every lease (Go's lessor).

    Guarantees:

    * :meth:`renew` returns the TTL etcd answered for *that* request: replies
      are matched by lease ID, and for one ID in the order the requests went
      out (etcd answers a stream in order), so a reply is never credited to a
      request sent after the one it answers, even when a waiter gave up;
    * a broken stream fails every waiting :meth:`renew` at once (with the
      same :class:`Transient` or :class:`ElectionError`, the channel retired
      if it is to blame) and is never used again: the next renewal opens a
      new stream, on the next endpoint after a failover;
    * :meth:`close` cancels the stream and its two tasks and waits for them.
    """

    def __init__(self, conn: Connection, channel: _Channel) -> None:
        self._conn = conn
        self._channel = channel
        self._call: Any = channel.lease.LeaseKeepAlive(metadata=channel.metadata)
        #: Per lease ID, one future per request sent and not yet answered, oldest first.
        self._waiting: dict[int, collections.deque[asyncio.Future[int]]] = {}
        self._outbox: asyncio.Queue[int] = asyncio.Queue()
        self.failure: Exception | None = None
        loop = asyncio.get_running_loop()
        name = f"aioelect-etcd-keepalive-{channel.endpoint}"
        self._tasks = (loop.create_task(self._write(), name=name), loop.create_task(self._read(), name=name))
        for task in self._tasks:
            task.add_done_callback(_consume)

    @property
    def usable(self) -> bool:
        return self.failure is None

    async def renew(self, lease_id: int, timeout: float) -> int:  # noqa: ASYNC109 - a timer, not a cancel scope
        """Send one keep-alive for ``lease_id`` and return the TTL etcd answered (<= 0: the lease is gone).

        Raises TimeoutError if no reply came within ``timeout`` seconds (a
        plain timer: this runs for every keep-alive of every lease).
        Cancelled or timed out, the request keeps its place in the reply
        order, so later replies still match their requests.
        """
        if self.failure is not None:
            raise copy.copy(self.failure)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._waiting.setdefault(lease_id, collections.deque()).append(future)
        self._outbox.put_nowait(lease_id)
        timer = loop.call_later(timeout, _time_out, future)
        try:
            return await future
        finally:
            timer.cancel()

    async def _write(self) -> None:
        try:
            while True:
                lease_id = await self._outbox.get()
                await self._call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
        except Exception as exc:
            self._fail(exc)

    async def _read(self) -> None:
        try:
            while True:
                reply = await self._call.read()
                if reply is grpc.aio.EOF:
                    raise Transient(f"etcd at {self._channel.endpoint} closed the keep-alive stream")
                waiters = self._waiting.get(int(reply.ID))
                if not waiters:
                    continue  # a reply to a request of an earlier stream cannot come here: ignore the stray
                future = waiters.popleft()
                if not waiters:
                    del self._waiting[int(reply.ID)]
                if not future.done():  # a waiter that gave up keeps its place, and is skipped here
                    future.set_result(int(reply.TTL))
        except asyncio.CancelledError:
            # Ours (close) or grpc's (the channel closed under the call): nobody may wait for a reply any more.
            self._fail(Transient(f"the keep-alive stream to {self._channel.endpoint} was cancelled"))
            raise
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        if self.failure is not None:
            return
        # Classified as any request's failure: a transient one retires the channel, so the next renewal fails over.
        failure = self._conn.failed(exc, "lease keep-alive", self._channel)
        if failure is exc and not isinstance(exc, (Transient, ElectionError)):
            failure = Transient(f"lease keep-alive on {self._channel.endpoint} failed: {exc!r}")
        self.failure = failure
        self._call.cancel()
        for waiters in self._waiting.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(copy.copy(failure))
        self._waiting.clear()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def close(self) -> None:
        """Cancel the stream; waiting renewals raise :class:`Transient`. Never interrupted."""
        self._fail(Transient(f"the keep-alive stream to {self._channel.endpoint} was closed", rotate=False))
        with anyio.CancelScope(shield=True):
            await asyncio.wait(self._tasks)


class WatchStream:
    """One etcd watch on its own gRPC stream; see :meth:`Connection.watch`."""

    def __init__(self, call: Any, channel: _Channel, conn: Connection, created_revision: int = 0) -> None:
        self._call = call
        self._channel = channel
        self._conn = conn
        #: The store's revision when etcd created the watch. A watch whose start revision is not above it
        #: may be "unsynced": etcd then sends its events from a background loop, up to 100 ms later.
        self.created_revision = created_revision

    async def next(self) -> Any:
        """The next WatchResponse that carries events.

        Raises :class:`Retired` when the client was replaced (the stream is
        then dead: open a new watch), :class:`Compacted`, :class:`Transient`,
        or :class:`ElectionError` if etcd refuses the watch.
        """
        while True:
            which, response = await first_of(self._read, self._channel.retired.wait)
            if which == 1:
                raise Retired()
            response = self._conn.check_watch_response(response, self._channel, "watch")
            if response.events:
                return response

    async def _read(self) -> Any:
        try:
            return await settle(self._call.read())
        except Exception as exc:
            failure = self._conn.failed(exc, "watch", self._channel)
            if failure is exc:
                raise
            raise failure from None


class Connection:
    """The elector's one connection to etcd: one aetcd client at a time, failing over between endpoints.

    Guarantees:

    * every request is bounded in time;
    * a transient failure retires the current client, so the next request
      goes to the next endpoint and every watch waiting on the old client
      moves over (it raises :class:`Retired`); it is raised as :class:`Transient`;
    * a permanent failure (wrong credentials, permission denied) raises
      :class:`ElectionError` at once; so does a connection that can never
      work as configured (a refused or untrusted certificate, TLS on one
      side only), found by :func:`diagnose_tls` on an endpoint that never
      answered: such a failure is not an unreachable etcd;
    * a client is closed only once no request or watch uses it, so nothing is
      cancelled under a caller; :meth:`aclose` closes them all (after letting
      requests in flight end for at most ``DRAIN_TIMEOUT``; watches end at once).
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        username: str | None,
        password: str | None,
        connect_timeout: float,
        log: Callable[[], ElectionLog],
        tls: EtcdTLS | None = None,
    ) -> None:
        self.endpoints = list(endpoints)
        self.username = username
        self._password = password
        self.tls = tls
        #: Endpoints that answered once: their later failures are outages, not misconfiguration.
        self._reached: set[Endpoint] = set()
        self.connect_timeout = connect_timeout
        self._log = log
        self._index = 0
        self._current: _Channel | None = None
        self._channels: set[_Channel] = set()
        self._connecting = anyio.Lock()
        self._auth_disabled = False
        self.closed = False
        #: Monotonic time of the last request that etcd answered, with a result or an error (-inf: none yet).
        self.answered_at = float("-inf")
        self._transport_checked = False

    def __repr__(self) -> str:
        return f"<Connection {self.describe()}>"

    @property
    def log(self) -> ElectionLog:
        return self._log()

    @property
    def ever_answered(self) -> bool:
        """True once any etcd member has answered any request of this connection (with a result or an error)."""
        return self.answered_at > float("-inf")

    def transport_warning(self) -> str | None:
        """Why this connection is exposed on the network, or None.

        Plain HTTP to an endpoint that is not loopback is; TLS always
        verifies the server here, so TLS never is.
        """
        if self.tls is not None:
            return None
        remote = [e for e in self.endpoints if not is_loopback(e.host)]
        if not remote:
            return None
        return transport_warning(
            "etcd at " + ", ".join(str(e) for e in remote),
            encrypted=False,
            verified=False,
            fix="use https:// endpoints, with ca_file unless the system CAs sign etcd's certificate",
        )

    def warn_transport(self) -> None:
        """Log :meth:`transport_warning` as a WARNING, once per connection (so once per elector)."""
        if self._transport_checked:
            return
        self._transport_checked = True
        warning = self.transport_warning()
        if warning is not None:
            self.log.warning("%s", warning)

    def describe(self) -> str:
        if self.tls is None:
            return ",".join(str(e) for e in self.endpoints)
        return ",".join(f"https://{e}" for e in self.endpoints) + f" over {self.tls.describe()}"

    # --- clients -------------------------------------------------------------------

    async def _current_channel(self) -> _Channel:
        current = self._current
        if current is not None and not current.retired.is_set() and not self.closed:
            return current  # the common case, without taking the lock (a checkpoint per request)
        async with self._connecting:
            if self.closed:
                raise ElectionError("the elector is closed")
            current = self._current
            if current is not None and not current.retired.is_set():
                return current
            endpoint = self.endpoints[self._index]
            self.warn_transport()
            channel = await self._open(endpoint)
            self._current = channel
            self._channels.add(channel)
            return channel

    async def _open(self, endpoint: Endpoint) -> _Channel:
        with_auth = self.username is not None and not self._auth_disabled
        client = _Client(
            endpoint.host,
            endpoint.port,
            credentials=self.tls.credentials() if self.tls is not None else None,
            username=self.username if with_auth else None,
            password=self._password if with_auth else None,
            timeout=self.connect_timeout,
            options=GRPC_OPTIONS,
        )
        try:
            with anyio.fail_after(self.connect_timeout + 0.5):
                await settle(client.connect())
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._close_client(client)
            if not isinstance(exc, Exception):
                raise
            error = _rpc_error(exc)
            if error is not None and "authentication is not enabled" in str(error.details()):
                # As etcd's Go client does: credentials for a server without auth are not an error.
                self.log.debug("etcd at %s has authentication disabled; connecting without credentials", endpoint)
                self._auth_disabled = True
                return await self._open(endpoint)
            failure = classify(exc, "authentication" if with_auth else "connect", endpoint, self.username)
            if failure is None:
                raise
            if isinstance(failure, ElectionError):
                self.answered_at = monotonic()  # etcd refused the credentials: it answered
            failure = await self._explain(failure, endpoint)
            if isinstance(failure, Transient) and failure.rotate:
                self._rotate()
            raise failure from None
        if with_auth:
            self._reached.add(endpoint)
            self.answered_at = monotonic()
        self.log.debug("connected to etcd at %s", endpoint)
        return _Channel(client, endpoint)

    async def _explain(self, failure: Exception, endpoint: Endpoint) -> Exception:
        """``failure``, or :class:`ElectionError` if :func:`diagnose_tls` finds that it is permanent."""
        if not isinstance(failure, Transient) or not failure.handshake or endpoint in self._reached:
            return failure
        step = min(self.connect_timeout, 2.0)
        verdict: str | None = None
        with anyio.move_on_after(3 * step + 0.5):
            verdict = await anyio.to_thread.run_sync(diagnose_tls, endpoint, self.tls, step, abandon_on_cancel=True)
        if verdict is None:
            return failure
        self.log.debug("%s (gRPC said: %s)", verdict, failure)
        return ElectionError(verdict)

    def _rotate(self) -> None:
        self._index = (self._index + 1) % len(self.endpoints)

    def fail(self, channel: _Channel, failure: Transient) -> None:
        """Retire ``channel`` after ``failure`` so that the next request goes to the next endpoint."""
        if not failure.rotate or channel is not self._current or channel.retired.is_set():
            return
        channel.retired.set()
        self._current = None
        self._rotate()
        self.log.debug("etcd endpoint %s failed (%s); next: %s", channel.endpoint, failure, self.endpoints[self._index])

    def failed(self, exc: Exception, what: str, channel: _Channel) -> Exception:
        """The exception to raise for ``exc`` (see :func:`classify`); retires ``channel`` if it is to blame."""
        failure = classify(exc, what, channel.endpoint, self.username)
        if failure is None:
            return exc
        if isinstance(failure, Transient):
            self.fail(channel, failure)
        elif failure is not exc:
            self.answered_at = monotonic()  # a refusal that etcd itself gave (permission, credentials)
        return failure

    @contextlib.asynccontextmanager
    async def channel(self) -> AsyncIterator[_Channel]:
        """The current client, kept open while the block runs."""
        channel = await self._current_channel()
        channel.users += 1
        try:
            yield channel
        finally:
            channel.users -= 1
            if channel.retired.is_set() and channel.users == 0:
                await self._close_channel(channel)

    async def _close_channel(self, channel: _Channel) -> None:
        if channel.closed:
            return
        channel.closed = True
        self._channels.discard(channel)
        if self._current is channel:
            self._current = None
        with anyio.CancelScope(shield=True):
            if channel.keepalives is not None:
                await channel.keepalives.close()
            await self._close_client(channel.client)

    async def _close_client(self, client: Any) -> None:
        with anyio.move_on_after(2.0):
            try:
                await settle(client.close())
            except Exception as exc:
                self.log.debug("closing an etcd client failed: %r", exc)

    async def aclose(self) -> None:
        """Close every client; watches end with :class:`Retired`, later requests raise ElectionError."""
        self.closed = True
        self._current = None
        channels = list(self._channels)
        for channel in channels:
            channel.retired.set()
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(DRAIN_TIMEOUT):
                while any(c.users for c in channels):  # noqa: ASYNC110 - a few short polls while requests end
                    await anyio.sleep(0.01)
            for channel in channels:
                await self._close_channel(channel)

    # --- requests ------------------------------------------------------------------

    def keepalives(self, channel: _Channel) -> KeepAliveStream:
        """The channel's shared keep-alive stream, opened now if it has none or its last one broke."""
        stream = channel.keepalives
        if stream is None or not stream.usable:
            stream = channel.keepalives = KeepAliveStream(self, channel)
        return stream

    async def call(
        self,
        what: str,
        request: Callable[[_Channel], Awaitable[T]],
        *,
        timeout: float,  # noqa: ASYNC109 - a per-attempt bound, not the caller's deadline
        attempts: int | None = None,
        direct: bool = False,
    ) -> T:
        """Run ``request`` on the current client, at most ``timeout`` seconds per attempt.

        On a transient failure the next endpoint is tried, each at most once
        (``attempts`` bounds it further); the last failure is raised as
        :class:`Transient`. Permanent failures raise :class:`ElectionError`.
        ``direct``: ``request`` awaits no gRPC call itself (only futures of
        ours) and bounds itself by ``timeout`` (raising TimeoutError), so it
        needs neither a :func:`settle` task nor a cancel scope.
        """
        tries = min(attempts or len(self.endpoints), len(self.endpoints))
        last: Transient | None = None
        attempt = 0
        while attempt < tries:
            attempt += 1
            try:
                async with self.channel() as channel:
                    try:
                        if direct:
                            reply = await request(channel)
                        else:
                            with anyio.fail_after(timeout):
                                reply = await settle(request(channel))
                    except Exception as exc:
                        failure = await self._explain(self.failed(exc, what, channel), channel.endpoint)
                        if failure is exc:
                            raise
                        raise failure from None
                    self._reached.add(channel.endpoint)
                    self.answered_at = monotonic()
                    return reply
            except Transient as exc:
                if exc.answered:
                    self.answered_at = monotonic()
                if exc.reauth and not (last is not None and last.reauth):
                    tries += 1  # once more, on a client that authenticates afresh
                last = exc
                if not exc.rotate:
                    break
        assert last is not None
        raise last

    @contextlib.asynccontextmanager
    async def watch(
        self,
        key: bytes,
        *,
        start_revision: int,
        range_end: bytes | None = None,
        no_put: bool = False,
        no_delete: bool = False,
    ) -> AsyncIterator[WatchStream]:
        """An etcd watch on its own stream, always cancelled when the block ends.

        The watch is created (etcd acknowledged it) before the block runs, or
        :class:`Transient` / :class:`Compacted` / :class:`ElectionError` is raised.
        """
        async with self.channel() as channel:
            call = channel.watch.Watch(metadata=channel.metadata)
            try:
                create = rpc.WatchCreateRequest(key=key, start_revision=start_revision)
                if range_end is not None:
                    create.range_end = range_end
                if no_put:
                    create.filters.append(rpc.WatchCreateRequest.NOPUT)
                if no_delete:
                    create.filters.append(rpc.WatchCreateRequest.NODELETE)
                try:
                    with anyio.fail_after(self.connect_timeout):
                        await settle(call.write(rpc.WatchRequest(create_request=create)))
                        created = await settle(call.read())
                except Exception as exc:
                    failure = await self._explain(self.failed(exc, "watch", channel), channel.endpoint)
                    if failure is exc:
                        raise
                    raise failure from None
                if created is not grpc.aio.EOF:
                    self.answered_at = monotonic()
                created = self.check_watch_response(created, channel, "watch")
                if not created.created:
                    raise Transient(f"etcd at {channel.endpoint} did not acknowledge the watch")
                yield WatchStream(call, channel, self, int(created.header.revision))
            finally:
                call.cancel()

    def check_watch_response(self, response: Any, channel: _Channel, what: str) -> Any:
        """Return ``response`` if it is a live watch response, else raise what it means."""
        if response is grpc.aio.EOF:
            failure = Transient(f"etcd at {channel.endpoint} closed the {what} stream")
            self.fail(channel, failure)
            raise failure
        if response.compact_revision:
            raise Compacted(int(response.compact_revision))
        if response.canceled:
            reason = str(response.cancel_reason) or "no reason given"
            if "permission denied" in reason:
                raise ElectionError(f"etcd at {channel.endpoint} refused the {what}: {reason}")
            raise Transient(f"etcd at {channel.endpoint} cancelled the {what}: {reason}", answered=True)
        return response


class Session:
    """A lease kept alive in the background, like etcd's Go ``concurrency.Session``.

    Guarantees:

    * the lease lives at least until ``confirmed_at + ttl``: ``confirmed_at``
      is the monotonic time at which the last grant or keep-alive that etcd
      acknowledged was *sent*;
    * ``done`` is set, with ``reason``, as soon as the lease may be gone: etcd
      reports it expired or revoked, or no keep-alive succeeded for ``ttl``
      seconds;
    * ``on_confirm``, when set, is called with the send time of every
      acknowledged keep-alive;
    * after :meth:`close` nothing of the session runs and its lease is revoked
      (or, if etcd cannot be reached, expires by itself).
    """

    def __init__(
        self,
        conn: Connection,
        lease_id: int,
        ttl: int,
        *,
        confirmed_at: float,
        interval: float,
        keepalive_timeout: float,
        request_timeout: float,
    ) -> None:
        self.conn = conn
        self.lease_id = lease_id
        self.ttl = ttl
        self.confirmed_at = confirmed_at
        self.interval = interval
        self.keepalive_timeout = keepalive_timeout
        self.request_timeout = request_timeout
        self.done = anyio.Event()
        self.reason: str | None = None
        self.on_confirm: Confirm | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<Session lease={self.lease_id:x} ttl={self.ttl}s {'ended' if self.done.is_set() else 'alive'}>"

    @classmethod
    async def grant(
        cls, conn: Connection, ttl: int, *, interval: float, keepalive_timeout: float, request_timeout: float
    ) -> Session:
        """Grant a lease and start keeping it alive.

        The lease ID is chosen here, so that a grant interrupted before its
        reply arrives can still be revoked: nothing is left behind.
        """
        lease_id = secrets.randbelow(2**62) + 1
        sent = monotonic()
        try:
            reply = await conn.call(
                "lease grant",
                lambda ch: ch.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl, ID=lease_id), metadata=ch.metadata),
                timeout=request_timeout,
            )
        except BaseException as exc:
            if not isinstance(exc, Exception) or (isinstance(exc, Transient) and exc.timed_out):
                # The grant may have been applied without our hearing of it. Briefly: if etcd does not
                # answer, the lease (without keys) expires by itself.
                bound = min(request_timeout, 1.0)
                with anyio.CancelScope(shield=True), anyio.move_on_after(bound):
                    await _revoke(conn, lease_id, bound)
            raise
        if reply.error:
            raise Transient(f"etcd refused the lease: {reply.error}", answered=True)
        if ttl != reply.TTL:
            conn.log.debug("etcd granted a %ss lease for the %ss asked (its minimum TTL)", reply.TTL, ttl)
        session = cls(
            conn,
            lease_id,
            ttl,
            confirmed_at=sent,
            interval=interval,
            keepalive_timeout=keepalive_timeout,
            request_timeout=request_timeout,
        )
        task = asyncio.get_running_loop().create_task(session._keep_alive(), name=f"aioelect-etcd-lease-{lease_id:x}")
        task.add_done_callback(session._keeper_done)
        session._task = task
        return session

    def _keeper_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.conn.log.error("keep-alive of lease %x failed", self.lease_id, exc_info=task.exception())
            self._end(f"keep-alive failed: {task.exception()!r}")

    def expire(self, reason: str) -> None:
        """End the session because etcd says its lease is gone."""
        self._end(reason)

    def _end(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.conn.log.debug("session %x ended: %s", self.lease_id, reason)
        self.done.set()

    def _confirmed(self, sent: float) -> None:
        if sent > self.confirmed_at:
            self.confirmed_at = sent
        if self.on_confirm is not None:
            self.on_confirm(sent)

    async def keepalive(self) -> float:
        """Renew the lease once; return when the keep-alive was sent.

        Raises :class:`SessionEnded` if etcd says the lease is gone,
        :class:`Transient` if etcd could not be asked.
        """
        if self.done.is_set():
            raise SessionEnded(self.reason or "session ended")
        sent = monotonic()
        ttl = await self.conn.call(
            "lease keep-alive",
            lambda ch: self.conn.keepalives(ch).renew(self.lease_id, self.keepalive_timeout),
            timeout=self.keepalive_timeout,
            direct=True,
        )
        if ttl <= 0:
            self._end("etcd reports the lease expired or revoked")
            raise SessionEnded(self.reason or "lease gone")
        self._confirmed(sent)
        return sent

    async def _keep_alive(self) -> None:
        backoff = Backoff(first=min(0.05, self.interval / 4), maximum=self.interval / 2)
        next_at = self.confirmed_at + self.interval
        while True:
            await anyio.sleep(max(0.0, next_at - monotonic()))
            left = self.confirmed_at + self.ttl - monotonic()
            if left <= 0:
                self._end(f"no keep-alive succeeded for {self.ttl}s: the lease may have expired")
                return
            try:
                with anyio.fail_after(left):
                    sent = await self.keepalive()
            except SessionEnded:
                return
            except ElectionError as exc:
                self._end(f"keep-alive refused: {exc}")
                return
            except (Transient, TimeoutError) as exc:
                delay = backoff.next_delay()
                # The first failure of a streak is worth a warning; the retries that follow are not.
                level = logging.WARNING if backoff.attempt == 1 else logging.DEBUG
                self.conn.log.log(
                    level,
                    "keep-alive of lease %x failed (%s); retrying in %.2fs",
                    self.lease_id,
                    str(exc) or "timed out",
                    delay,
                )
                next_at = monotonic() + delay
                continue
            backoff.reset()
            next_at = sent + self.interval

    async def wait_ended(self) -> str:
        """Return the reason once the session has ended."""
        await self.done.wait()
        return self.reason or "session ended"

    async def stop(self) -> None:
        """Stop the keep-alives and wait until they have stopped. Idempotent; never interrupted."""
        self.on_confirm = None
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([task])
        self._end("session closed")

    async def close(self) -> None:
        """Stop the keep-alives, then revoke the lease (at most ``request_timeout``). Idempotent.

        Cancellation may cut the revoke short (the lease then expires by
        itself), never the stopping of the keep-alives.
        """
        await self.stop()
        if self._closed:
            return
        self._closed = True
        with anyio.move_on_after(self.request_timeout):
            await _revoke(self.conn, self.lease_id, self.request_timeout)


async def _revoke(conn: Connection, lease_id: int, timeout: float) -> None:  # noqa: ASYNC109
    """Revoke a lease, best effort: an unknown lease is already gone, an unreachable etcd expires it."""
    try:
        await conn.call(
            "lease revoke",
            lambda ch: ch.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease_id), metadata=ch.metadata),
            timeout=timeout,
        )
    except (Transient, ElectionError) as exc:
        conn.log.debug("revoking lease %x failed (%s); it expires by itself", lease_id, exc)
