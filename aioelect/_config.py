"""Validation and parsing of user input, shared by every backend."""

from __future__ import annotations

import math
import os
import re
import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["DSN", "parse_dsn", "positive", "tls_context", "tls_from_query", "validate_name"]

_NAME_RE = re.compile(r"^[\x21-\x7e]+$")


def validate_name(name: str, *, max_length: int = 255) -> str:
    """Return ``name`` if it is 1 to ``max_length`` printable ASCII characters without spaces."""
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if len(name) > max_length:
        raise ValueError(f"name is {len(name)} characters long; this backend allows at most {max_length}")
    if not _NAME_RE.match(name):
        raise ValueError(f"name {name!r} must be printable ASCII without spaces")
    return name


def positive(option: str, value: float, *, maximum: float | None = None) -> float:
    """Return ``value`` as a float if it is finite and > 0 (and <= maximum), else raise ValueError."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{option} must be a number, not {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{option} must be a finite number > 0, not {value!r}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{option} must be at most {maximum:g}, not {value!r}")
    return number


@dataclass(frozen=True)
class DSN:
    """A parsed ``scheme://user:password@host:port/database?k=v`` address.

    The password never appears in ``repr()`` or ``str()``.
    """

    scheme: str
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    database: str | None = None
    query: dict[str, str] = field(default_factory=dict)

    def redacted(self) -> str:
        """The address with the password replaced by ``***``."""
        auth = ""
        if self.user is not None:
            auth = self.user + (":***" if self.password is not None else "") + "@"
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.scheme}://{auth}{self.host or ''}{port}/{self.database or ''}"

    def __str__(self) -> str:
        return self.redacted()


def parse_dsn(dsn: str, *schemes: str) -> DSN:
    """Parse ``dsn``, whose scheme must be one of ``schemes``; raise ValueError (without the password) if malformed."""
    if not isinstance(dsn, str) or "://" not in dsn:
        raise ValueError(f"a DSN must look like {schemes[0]}://user:password@host:port/database")
    parts = urlsplit(dsn)
    if parts.scheme not in schemes:
        raise ValueError(f"DSN scheme must be one of {', '.join(schemes)}, not {parts.scheme!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("DSN port must be a number from 1 to 65535") from None
    database = unquote(parts.path.lstrip("/")) or None
    return DSN(
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        user=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        database=database,
        query=dict(parse_qsl(parts.query)),
    )


def tls_context(
    *,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    verify_identity: bool = True,
    verify: bool = True,
) -> ssl.SSLContext:
    """A client TLS context: server verified against ``ca`` (or the system CAs), optional client certificate.

    ``verify=False`` encrypts without verifying the server (MySQL's
    ``ssl-mode=REQUIRED``); ``verify_identity=False`` verifies the chain but
    not the host name. Missing or unreadable files raise ValueError.
    """
    for option, path in (("ssl-ca", ca), ("ssl-cert", cert), ("ssl-key", key)):
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{option} file {path!r} does not exist")
    if key is not None and cert is None:
        raise ValueError("ssl-key needs ssl-cert")
    context = ssl.create_default_context(cafile=ca)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif not verify_identity:
        context.check_hostname = False
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load the client certificate: {exc}") from None
    return context


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def tls_from_query(query: dict[str, str]) -> ssl.SSLContext | None:
    """The TLS context a DSN's query asks for, or None.

    Understood: ``ssl-mode`` (DISABLED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY;
    default VERIFY_IDENTITY when any file is given), ``ssl-ca``, ``ssl-cert``,
    ``ssl-key``.
    """
    mode = query.get("ssl-mode", "").upper()
    ca, cert, key = query.get("ssl-ca"), query.get("ssl-cert"), query.get("ssl-key")
    if mode == "DISABLED" or (not mode and not (ca or cert)):
        return None
    if mode and mode not in ("REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY"):
        raise ValueError(f"ssl-mode must be DISABLED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY, not {mode!r}")
    mode = mode or "VERIFY_IDENTITY"
    return tls_context(ca=ca, cert=cert, key=key, verify=mode != "REQUIRED", verify_identity=mode == "VERIFY_IDENTITY")
