"""Validation and parsing of user input, shared by every backend."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["DSN", "parse_dsn", "positive", "validate_name"]

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
