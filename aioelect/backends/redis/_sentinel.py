"""Redis through Sentinel: the master a Sentinel names proves itself before it is sent anything.

A Sentinel's reply is only an address. Before the master's credentials go
to it, the master must prove itself with what the operator configured,
never with that reply alone:

* ``master_hosts`` (a URL parameter): the address must be listed, else no
  connection is opened (a transient error naming the address);
* over TLS (``rediss+sentinel://``) the master's certificate must name
  ``master_tls_name``; without it, the address if ``master_hosts`` listed
  it, else the master's name in the URL
  (:meth:`~._options.RedisSettings.master_tls_host`). Redis sends ``AUTH``
  only after the handshake, so a master that fails it receives nothing.

A plaintext Sentinel URL with credentials and no ``master_hosts`` is
refused when the settings are parsed. The Sentinels themselves are asked
with their own credentials (``sentinel_password``), over TLS verified
against their host names when the URL is ``rediss+sentinel://``; when all
of them refuse those credentials or our certificate check, the campaign
fails at once (:class:`Sentinels`), as with the master's.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from typing import Any

from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.connection import SSLConnection
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool, SentinelManagedConnection

from ...core._errors import PermanentBackendError
from ._options import RedisSettings, _netloc

__all__ = ["MasterConnection", "MasterRefused", "MasterSSLConnection", "Sentinels", "sentinel_client"]

#: Called with the host of every master a Sentinel names, before connecting (logs the transport WARNING once).
Seen = Callable[[str], None]


class Sentinels(Sentinel):
    """redis-py's :class:`Sentinel`; when no Sentinel names the master and every one of them refuses us for a
    reason no retry can fix (credentials, ACL, a certificate), a PermanentBackendError says so instead of the
    transient "no master found"."""

    shown = ""

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)  # type: ignore[no-untyped-call, unused-ignore]
        except MasterNotFoundError:
            refusal = await self._refusal()
            if refusal is not None:
                raise PermanentBackendError(
                    f"every Sentinel of {self.shown} refused us: {type(refusal).__name__}: {refusal}"
                ) from None
            raise

    async def _refusal(self) -> BaseException | None:
        errors: list[BaseException] = []
        for sentinel in self.sentinels:
            try:
                await sentinel.ping()
            except Exception as exc:
                errors.append(exc)
            else:
                return None
        final = [e for e in errors if isinstance(e, (rexc.AuthenticationError, rexc.NoPermissionError)) or _tls(e)]
        return final[0] if errors and len(final) == len(errors) else None


def _tls(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a certificate that failed verification (redis-py keeps only the text)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


class MasterRefused(rexc.ConnectionError):
    """A Sentinel named a master that ``master_hosts`` does not list: nothing is sent to it (transient)."""


class MasterConnection(SentinelManagedConnection):
    """A connection to the master a Sentinel names, opened only once the address passes ``master_hosts``."""

    def __init__(self, *, settings: RedisSettings, seen: Seen, **kwargs: Any) -> None:
        self._settings = settings
        self._seen = seen
        super().__init__(**kwargs)  # type: ignore[no-untyped-call, unused-ignore]

    async def connect_to(self, address: tuple[str, int]) -> None:
        host, port = str(address[0]), int(address[1])
        if not self._settings.master_admitted(host, port):
            raise MasterRefused(
                f"a Sentinel named {_netloc(host, port)} as master {self._settings.master_name!r}, an address "
                "master_hosts does not list: nothing was sent to it"
            )
        self._seen(host)
        await super().connect_to((host, port))  # type: ignore[no-untyped-call, unused-ignore]


class MasterSSLConnection(MasterConnection, SSLConnection):
    """:class:`MasterConnection` over TLS, the certificate checked against the name the operator configured."""

    def _connection_arguments(self) -> Mapping[str, Any]:
        arguments = dict(super()._connection_arguments())
        arguments["server_hostname"] = self._settings.master_tls_host(str(self.host))
        return arguments


def sentinel_client(settings: RedisSettings, options: dict[str, Any], seen: Seen) -> tuple[Redis, list[Redis]]:
    """One connection to the master the Sentinels name when it connects, and the Sentinels' clients (to close)."""
    options = {k: v for k, v in options.items() if k not in ("host", "port")}
    tls = bool(options.pop("ssl", False))
    sentinel = Sentinels(  # type: ignore[no-untyped-call, unused-ignore]
        settings.sentinels, sentinel_kwargs=settings.sentinel_options({**options, "ssl": tls}), **options
    )
    sentinel.shown = settings.url
    pool = SentinelConnectionPool(  # type: ignore[no-untyped-call, unused-ignore]
        settings.master_name,
        sentinel,
        connection_class=MasterSSLConnection if tls else MasterConnection,
        settings=settings,
        seen=seen,
        decode_responses=True,
        **options,
    )
    client = Redis(connection_pool=pool, single_connection_client=True, decode_responses=True)
    return client, list(sentinel.sentinels)
