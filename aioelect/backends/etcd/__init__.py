"""etcd backend: etcd's own election algorithm (Go ``client/v3/concurrency``) on aetcd.

``session.py`` holds the connection (failover between endpoints) and the
lease session; ``election.py`` the campaign, the held leadership, ``leader()``
and ``observe()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from ..._config import positive, validate_name
from ..._elector import Elector
from .election import EtcdBackend
from .session import Endpoint, EtcdTLS

__all__ = ["EtcdElector", "parse_endpoints"]

DEFAULT_PORT = 2379
#: etcd grants no lease shorter than its minimum TTL (2 s with default timings).
MIN_TTL = 2


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


class EtcdElector(Elector):
    """A candidate in an etcd election, compatible with etcd's own (Go ``concurrency``, ``etcdctl elect``).

    Guarantees (beyond :class:`~aioelect.Elector`'s):

    * at most one leader among every candidate on the same ``name``, ours,
      ``etcdctl elect`` or Go ``concurrency.Election`` alike: the leader is
      the key with the lowest create revision under ``{name}/``;
    * :attr:`Leadership.token` is the leader key's create revision: it
      increases from one leader to the next;
    * a release resigns (deletes our key): the next candidate takes over at
      once; as with Go's ``Session``, the lease stays for this elector's next
      campaign (revoked at once if the leadership was lost, the resign failed
      or keep-alives were late) and is revoked by :meth:`aclose`, which
      leaves no lease or key behind; a crashed or cut-off leader is replaced
      once its lease expires, about ``ttl`` seconds later;
    * a leader whose key is deleted, or whose lease is revoked or expires,
      learns it from a watch and its keep-alives; one that cannot renew for
      ``renew_deadline`` seconds fences itself before its lease can expire;
    * a candidate waits on the one key created just before its own, notices
      its own session ending while it waits and campaigns again, and checks
      that its key still stands before it leads;
    * cancelling a campaign deletes its key and revokes its lease at once;
    * a failing endpoint is left for the next one in ``endpoints``;
    * wrong credentials raise :class:`~aioelect.ElectionError` at once; so
      does a TLS setup that cannot work (a server certificate that ``ca_file``
      does not verify, a client certificate missing or refused, TLS on one
      side only): that is never taken for an unreachable etcd, so it never
      degrades to local leadership;
    * while etcd cannot be reached, a candidate retries with backoff and
      stays a follower until etcd answers;
    * only with ``degrade_to_local=True`` (off by default; the environment
      variable ``AIOELECT_ETCD_DEGRADE_TO_LOCAL`` of :func:`aioelect.from_env`)
      may it lead locally instead, WITHOUT mutual exclusion (every instance
      that cannot reach etcd may lead), with a WARNING, and only while etcd
      has never answered this elector since it was created: never after a
      campaign, a leadership or a :meth:`leader` call reached etcd, so never
      after a loss. A degraded leadership keeps asking etcd and is lost
      (``lost_reason`` says "etcd answered") as soon as etcd answers; the
      next campaign, by :meth:`run` or the caller, is on etcd.

    ``endpoints`` is a list, or a comma-separated string, of ``host:port``,
    ``http://host:port`` or ``https://host:port``. TLS is used with
    ``https://`` endpoints or when any of ``ca_file``, ``cert_file``,
    ``key_file`` is given: the server's certificate is verified against
    ``ca_file`` (PEM; the system CAs without it) and must name the endpoint's
    host (an IP address in its subjectAltName for ``127.0.0.1:2379``);
    ``cert_file`` and ``key_file`` (PEM, unencrypted key) are the client
    certificate for etcd's ``--client-cert-auth``. The files are checked
    here and read again at each reconnection; TLS always verifies the
    server (there is no option to skip it). ``https://`` on some endpoints
    only is a ValueError. ``username``/``password`` work with or without TLS
    (use TLS so that the password is not sent in clear): without TLS, the
    first connection logs one WARNING per elector naming the endpoints that
    are not loopback (127.0.0.0/8, ``::1``, ``localhost``).

    ``ttl`` is the session lease in whole seconds (at least 2); keep-alives
    go out every ``ttl / 3`` (on one long-lived gRPC stream); ``renew_deadline``
    (default ``2 * ttl / 3``) must lie between the two. ``connect_timeout``
    bounds authenticating and each request on one endpoint (keep-alives have
    their own, shorter bound, derived from the timings above).
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        name: str,
        ttl: int = 5,
        identity: str | None = None,
        username: str | None = None,
        password: str | None = None,
        degrade_to_local: bool = False,
        connect_timeout: float = 5.0,
        renew_deadline: float | None = None,
        stop_timeout: float = 5.0,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        parsed = parse_endpoints(endpoints)
        tls_files = any(f is not None for f in (ca_file, cert_file, key_file))
        plain = [e for e in parsed if e.scheme == "http"]
        if plain and tls_files:
            raise ValueError(
                f"endpoint http://{plain[0]} is plain HTTP but ca_file/cert_file/key_file ask for TLS: use https://"
            )
        https = parsed[0].scheme == "https"  # every endpoint's, as parse_endpoints checked
        tls = EtcdTLS.load(ca_file, cert_file, key_file) if tls_files or https else None
        name = validate_name(name, max_length=1024)
        if isinstance(ttl, bool) or not float(positive("ttl", ttl)).is_integer():
            raise ValueError(f"ttl must be a whole number of seconds (etcd leases have whole-second TTLs), not {ttl!r}")
        ttl = int(ttl)
        if ttl < MIN_TTL:
            raise ValueError(f"ttl must be at least {MIN_TTL} seconds: etcd grants no shorter lease")
        interval = ttl / 3
        deadline = positive("renew_deadline", renew_deadline) if renew_deadline is not None else ttl * 2 / 3
        if deadline >= ttl:
            raise ValueError(
                f"renew_deadline ({deadline:g}s) must be shorter than ttl ({ttl}s): a leader must stop "
                "before its lease can expire and another candidate take over"
            )
        if deadline <= interval:
            raise ValueError(
                f"renew_deadline ({deadline:g}s) must be longer than the keep-alive interval ttl/3 ({interval:.3g}s): "
                "otherwise a healthy leader would fence itself between two keep-alives"
            )
        connect_timeout = positive("connect_timeout", connect_timeout)
        if (username is None) != (password is None):
            raise ValueError("username and password go together: pass both or neither")
        if username is not None and (not isinstance(username, str) or not username):
            raise ValueError("username must be a non-empty string")
        if password is not None and not isinstance(password, str):
            raise ValueError("password must be a string")
        if not isinstance(degrade_to_local, bool):
            raise ValueError(f"degrade_to_local must be True or False, not {degrade_to_local!r}")
        backend = EtcdBackend(
            endpoints=parsed,
            name=name,
            ttl=ttl,
            renew_deadline=deadline,
            connect_timeout=connect_timeout,
            username=username,
            password=password,
            degrade_to_local=degrade_to_local,
            tls=tls,
        )
        super().__init__(backend, identity=identity, stop_timeout=stop_timeout)

    @property
    def renew_deadline(self) -> float:
        """Seconds a leader may go without an acknowledged keep-alive before it fences itself."""
        assert isinstance(self._backend, EtcdBackend)
        return self._backend.renew_deadline
