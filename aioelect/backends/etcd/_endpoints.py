"""Where the etcd backend connects: endpoints given as ``host:port`` or ``http(s)://host:port``.

Guarantees: every endpoint parsed here has a host and a port, carries no
credentials and no path, and all endpoints are reached the same way (TLS on
all or on none): a mix is a ValueError, never plain HTTP to some of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["DEFAULT_PORT", "Endpoint", "parse_endpoints"]


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
