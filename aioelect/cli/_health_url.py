"""``--health-url``: a health check that passes while an HTTP GET of a URL answers 2xx.

Guarantees:

* only ``http://`` and ``https://`` URLs with a host are taken; anything
  else (another scheme, no host, a bad port, spaces or control characters)
  is a :class:`UsageError` before anything runs;
* ``https://`` verifies the server's certificate and host name against the
  system's trusted authorities (``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` are
  honoured);
* a user and password in the URL are sent as HTTP Basic authorization and
  never shown: every message names the URL without them, and without its
  query string; a URL with an ``@`` past its host (a password's unencoded
  ``/``, ``?`` or ``#``) is a :class:`UsageError` that shows none of it;
* one check is one connection, straight to the URL's host (no proxy, no
  redirect followed: a 3xx fails), closed once the status line is read; the
  check is cancelled (connection and all) when the health check's timeout
  passes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from ._status import UsageError

__all__ = ["HealthURL", "combined_check", "parse_health_url"]

#: The longest status line read: a server that sends more without a line break has failed.
MAX_STATUS_LINE = 8192


class UnhealthyAnswer(Exception):
    """The URL answered, but not with a 2xx status."""


@dataclass(frozen=True)
class HealthURL:
    """A checked ``--health-url``: where to connect, what to send, and how to name it."""

    scheme: str
    host: str
    port: int
    target: str
    #: The Host header's value.
    authority: str
    #: ``Basic ...`` for a user in the URL, else None.
    authorization: str | None
    #: The URL as messages show it: no user, password or query.
    shown: str

    def __repr__(self) -> str:
        return f"HealthURL({self.shown!r})"

    def request(self) -> bytes:
        lines = [
            f"GET {self.target} HTTP/1.1",
            f"Host: {self.authority}",
            "User-Agent: aioelect-health",
            "Accept: */*",
            "Connection: close",
        ]
        if self.authorization is not None:
            lines.append(f"Authorization: {self.authorization}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def check(self) -> bool:
        """GET the URL: True on a 2xx status; :class:`UnhealthyAnswer` otherwise, OSError if unreachable."""
        context = ssl.create_default_context() if self.scheme == "https" else None
        reader, writer = await asyncio.open_connection(
            self.host,
            self.port,
            ssl=context,
            server_hostname=self.host if context is not None else None,
            limit=MAX_STATUS_LINE,
        )
        try:
            writer.write(self.request())
            await writer.drain()
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError:
                raise UnhealthyAnswer(f"GET {self.shown}: the connection closed before a status line") from None
            except asyncio.LimitOverrunError:
                raise UnhealthyAnswer(f"GET {self.shown}: a status line over {MAX_STATUS_LINE} bytes") from None
            parts = line.decode("latin-1").split(None, 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise UnhealthyAnswer(f"GET {self.shown}: not an HTTP answer: {line[:60]!r}")
            status = int(parts[1])
            if not 200 <= status < 300:
                raise UnhealthyAnswer(f"GET {self.shown} answered {status}")
            return True
        finally:
            writer.close()
            with anyio.CancelScope(shield=True), anyio.move_on_after(1), contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()


def parse_health_url(url: str) -> HealthURL:
    """``url`` checked as :mod:`this module <aioelect.cli._health_url>` says; UsageError naming it without secrets."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise UsageError("--health-url: a URL has no spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        # An '@' past the host is a user and password whose '/', '?' or '#' split the URL early: they would
        # be read (and shown) as the host, port and path.
        if "@" in parts.path + parts.query + parts.fragment:
            raise UsageError(
                "--health-url: an '@' after the host: a '/', '?' or '#' in a user or password is percent-encoded"
            )
        port = parts.port
    except ValueError:
        # urllib's message quotes the part it could not read, which may be a password's.
        raise UsageError("--health-url: not a URL (its host or port cannot be read)") from None
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    where = host if ":" not in host else f"[{host}]"
    shown = f"{scheme}://{where}{'' if port is None else f':{port}'}{parts.path or '/'}"
    if scheme not in ("http", "https"):
        raise UsageError(f"--health-url: {shown if scheme else 'the URL'}: only http:// and https:// are checked")
    if not host:
        raise UsageError(f"--health-url: {shown}: the URL names no host")
    authorization = None
    if parts.username is not None or parts.password is not None:
        user = urllib.parse.unquote(parts.username or "")
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if parts.query:
        shown += "?..."
    authority = where if port is None else f"{where}:{port}"
    default = 443 if scheme == "https" else 80
    return HealthURL(scheme, host, port or default, target, authority, authorization, shown)


def combined_check(checks: list[Callable[[], Awaitable[object]]]) -> Callable[[], Awaitable[bool]]:
    """One health check that passes only if every one of ``checks`` passes (run one after the other)."""

    async def check() -> bool:
        for one in checks:
            if await one() is False:
                return False
        return True

    return check
