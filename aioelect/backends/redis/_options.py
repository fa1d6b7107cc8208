"""The Redis backend's options: the URL, the timing, what the fencing tokens may give up; validated at construction."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ...core._config import (
    DSN,
    LockTiming,
    TimingRules,
    check_options,
    is_loopback,
    parse_dsn,
    transport_warning,
    validate_name,
)

__all__ = ["RedisOptions", "RedisSettings"]

_SCHEMES = ("redis", "rediss")
_SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_TLS_KEYS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
#: URL parameters of a Sentinel URL: what the master a Sentinel names must prove before it gets the password.
_MASTER_KEYS = ("master_tls_name", "master_hosts")
#: URL parameters stating server settings a user without ``CONFIG GET`` cannot read (see :mod:`._bounds`).
_ASSUME_KEYS = ("assume_appendfsync", "assume_timeout")
_APPENDFSYNC = ("always", "everysec", "no")
#: A host name, an IPv4 address or a bracketed IPv6 address (a ``master_tls_name``); with a port, a
#: ``master_hosts`` entry.
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
_TLS_NAME = re.compile(_HOST)
_MASTER_HOST = re.compile(_HOST + r"(?::[0-9]{1,5})?")
#: How many keep-alive probes, one a second, declare a silent peer dead.
KEEPALIVE_PROBES = 2
#: The lease is the lock key's expiry (``PX``, milliseconds): any fraction of a second.
TIMING = TimingRules("the lock key's PX expiry", min_lease=0.5, whole_lease=False, poll_interval=1.0)


class _RedisElectionName(TypedDict):
    #: The election name: the keys are ``{key_prefix}{name}:lock`` and ``...:token`` (``{name}`` is the hash tag).
    name: str


class RedisOptions(_RedisElectionName, total=False):
    """The options of a Redis election; :class:`~aioelect.backends.redis.RedisBackend` validates them."""

    #: Seconds of the lock key's expiry (``PX``), set again by every renew (default 10).
    lease: float
    #: Seconds between the leader's renews (default 1, a tenth of a shorter lease), and the bound on one request
    #: (default 2).
    check_interval: float
    check_timeout: float
    #: Seconds a leader may go without a confirmed renew before it fences itself (default 0.7 * lease).
    renew_deadline: float | None
    #: Seconds to connect (default 5).
    connect_timeout: float
    #: Seconds between an observer's reads, a waiting candidate's reads of a lock key without an expiry, and at
    #: most between retries after an error (default 1). A waiter otherwise tries when a grant or release is
    #: published, or when the key can have expired.
    poll_interval: float
    #: Prefix of every key and channel (default ``aioelect:``); an ACL may limit the user to ``~{prefix}*``.
    key_prefix: str
    #: Grant only once ``WAIT`` says this many replicas have the lock and the token (default 0).
    min_replicas: int
    #: Accept tokens that a server crash can hand out twice (no ``appendfsync always``, no ``WAITAOF``).
    volatile_tokens: bool
    #: The Sentinels' user and password (``redis+sentinel://``; the URL's are the master's). Default: the variables
    #: ``AIOELECT_REDIS_SENTINEL_USERNAME`` and ``AIOELECT_REDIS_SENTINEL_PASSWORD``.
    sentinel_username: str | None
    sentinel_password: str | None


@dataclass(frozen=True)
class RedisSettings:
    """Every option, validated; the password never in ``repr()``."""

    name: str
    host: str
    port: int
    db: int
    username: str | None
    password: str | None = field(repr=False)
    tls: bool
    ssl_ca_certs: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None
    timing: LockTiming
    key_prefix: str
    min_replicas: int
    volatile_tokens: bool
    url: str
    #: Sentinel addresses (``redis+sentinel://``): the master named ``master_name`` is asked of them.
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str | None = None
    #: Redis Cluster nodes (``redis+cluster://``), asked in turn which master owns the election's slot.
    cluster_nodes: tuple[tuple[str, int], ...] = ()
    #: The Sentinels' own credentials; TLS to them is ``tls`` (``rediss+sentinel://``), verified per sentinel host.
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    #: The name a master's certificate must carry (``?master_tls_name=``); None: see :meth:`master_tls_host`.
    master_tls_name: str | None = None
    #: The addresses a master named by a Sentinel may have (``?master_hosts=host[:port],...``; port None: any).
    master_hosts: tuple[tuple[str, int | None], ...] = ()
    #: Server settings stated by the operator (``?assume_appendfsync=``, ``?assume_timeout=``), read in place of
    #: ``CONFIG GET``, which would also let the user read the server's passwords.
    assume_config: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, url: str, options: dict[str, Any]) -> RedisSettings:
        """ValueError naming the bad option (never the password), TypeError for an unknown one."""
        check_options("RedisElector", options, RedisOptions)
        name = validate_name(options["name"], max_length=512)
        if "{" in name or "}" in name:
            raise ValueError(f"name {name!r} must not contain '{{' or '}}': it becomes the keys' hash tag")
        sentinels: tuple[tuple[str, int], ...] = ()
        master_name = None
        cluster_nodes: tuple[tuple[str, int], ...] = ()
        if isinstance(url, str) and url.split("://", 1)[0] in _SENTINEL_SCHEMES:
            url, sentinels, master_name = _sentinel_url(url)
        elif isinstance(url, str) and url.split("://", 1)[0] in _CLUSTER_SCHEMES:
            url, cluster_nodes = _cluster_url(url)
        parsed: DSN = parse_dsn(url, *_SCHEMES)
        if not parsed.host:
            raise ValueError("a Redis URL must name a host: redis://user:password@host:port/db")
        db = 0
        if parsed.database is not None:
            if not parsed.database.isascii() or not parsed.database.isdigit() or int(parsed.database) > 1_000_000:
                raise ValueError("the Redis URL's path must be a database number such as /0")
            db = int(parsed.database)
        accepted = _TLS_KEYS + (_MASTER_KEYS if sentinels else ()) + _ASSUME_KEYS
        for key in parsed.query:
            if key not in accepted:
                raise ValueError(f"unsupported Redis URL parameter {key!r}; accepted: {', '.join(accepted)}")
        tls = parsed.scheme == "rediss"
        files = {key: parsed.query.get(key) or None for key in _TLS_KEYS}
        if not tls and any(files.values()):
            raise ValueError("ssl_ca_certs, ssl_certfile and ssl_keyfile need a rediss:// URL")
        for key, path in files.items():
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{key} file {path!r} does not exist")
        if files["ssl_keyfile"] and not files["ssl_certfile"]:
            raise ValueError("ssl_keyfile needs ssl_certfile")
        timing = TIMING.read(options)
        # Requests are bounded by check_timeout; keep-alives find a silently dead subscription (a waiter's, an
        # observer's) within the lease, so a waiter never sleeps through the expiry of a crashed leader's key.
        keepalive = keepalive_idle(timing) + KEEPALIVE_PROBES
        if keepalive > timing.lease:
            raise ValueError(
                f"check_interval ({timing.check_interval:g}s) makes TCP keep-alives take {keepalive:g}s to find a dead "
                f"connection, longer than lease ({timing.lease:g}s): raise lease to at least {keepalive:g}s"
            )
        prefix = options.get("key_prefix", "aioelect:")
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix or len(prefix) > 256:
            raise ValueError(f"key_prefix must be a string of at most 256 characters without braces, not {prefix!r}")
        replicas = options.get("min_replicas", 0)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 0 <= replicas <= 100:
            raise ValueError(f"min_replicas must be an integer from 0 to 100, not {replicas!r}")
        volatile = options.get("volatile_tokens", False)
        if volatile not in (True, False):
            raise ValueError(f"volatile_tokens must be True or False, not {volatile!r}")
        sentinel_auth = _sentinel_credentials(options, sentinels)
        master_hosts = _master_hosts(parsed.query.get("master_hosts"))
        master_tls_name = parsed.query.get("master_tls_name")
        if master_tls_name is not None and not _TLS_NAME.fullmatch(master_tls_name):
            raise ValueError("master_tls_name must be the host name (or address) the master's certificate names")
        if master_tls_name is not None and not tls:
            raise ValueError("master_tls_name needs a rediss+sentinel:// URL")
        if sentinels and not tls and not master_hosts and (parsed.password is not None or parsed.user is not None):
            raise ValueError(
                "a redis+sentinel:// URL with credentials would send them to whatever address a Sentinel names as "
                "the master, unverified: list the addresses a master may have (?master_hosts=host:port,host:port), "
                "or use rediss+sentinel:// (the master's certificate is then verified, see master_tls_name)"
            )
        return cls(
            name=name,
            host=parsed.host,
            port=parsed.port or 6379,
            db=db,
            username=parsed.user,
            password=parsed.password,
            tls=tls,
            ssl_ca_certs=files["ssl_ca_certs"],
            ssl_certfile=files["ssl_certfile"],
            ssl_keyfile=files["ssl_keyfile"],
            timing=timing,
            key_prefix=prefix,
            min_replicas=replicas,
            volatile_tokens=bool(volatile),
            url=_shown(parsed, sentinels, master_name, cluster_nodes),
            sentinels=sentinels,
            master_name=master_name,
            cluster_nodes=cluster_nodes,
            sentinel_username=sentinel_auth[0],
            sentinel_password=sentinel_auth[1],
            master_tls_name=master_tls_name,
            master_hosts=master_hosts,
            assume_config=_assumed(parsed.query),
        )

    @property
    def lock_key(self) -> str:
        return f"{self.key_prefix}{{{self.name}}}:lock"

    @property
    def token_key(self) -> str:
        return f"{self.key_prefix}{{{self.name}}}:token"

    @property
    def channel(self) -> str:
        return f"{self.key_prefix}{{{self.name}}}:changed"

    def warning(self) -> str | None:
        """The transport WARNING for a connection that crosses a network unencrypted or unauthenticated, or None.

        Through Sentinel: for the Sentinels that are not loopback, when they are asked in plaintext or without a
        password (the master's own link is judged when a Sentinel names it: :meth:`master_warning`).
        """
        if not self.sentinels:
            return transport_warning(
                self.host, encrypted=self.tls, verified=self.tls, fix="use rediss:// with ssl_ca_certs=PATH"
            )
        remote = [_netloc(h, p) for h, p in self.sentinels if not is_loopback(h)]
        if not remote:
            return None
        texts = []
        if not self.tls:
            texts.append(
                f"the connections to the Sentinels at {', '.join(remote)} are not encrypted: anyone on the path can "
                "read them and answer in their place, naming another master"
            )
        if self.sentinel_password is None:
            texts.append(
                f"the Sentinels at {', '.join(remote)} are asked without a password: anyone who reaches them can "
                "reconfigure them (SENTINEL SET, REMOVE, MONITOR) and name another master"
            )
        if not texts:
            return None
        return (
            "; ".join(texts)
            + " (use rediss+sentinel:// with ssl_ca_certs=PATH, and requirepass or an ACL user on the Sentinels with "
            "sentinel_password=, from the environment AIOELECT_REDIS_SENTINEL_PASSWORD)"
        )

    def master_warning(self, host: str) -> str | None:
        """The transport WARNING for the master a Sentinel named at ``host``, or None."""
        return transport_warning(
            host, encrypted=self.tls, verified=self.tls, fix="use rediss+sentinel:// with ssl_ca_certs=PATH"
        )

    def master_tls_host(self, host: str) -> str:
        """The name a master's certificate must carry when a Sentinel names it at ``host``: ``master_tls_name``;
        else ``host`` if ``master_hosts`` admits it (the operator listed it); else the master's name in the URL.
        Never an address taken from a Sentinel's reply alone."""
        if self.master_tls_name is not None:
            return self.master_tls_name
        if self.master_hosts:
            return host
        assert self.master_name is not None
        return self.master_name

    def master_admitted(self, host: str, port: int) -> bool:
        """Whether ``master_hosts`` (if given) lists the address a Sentinel named."""
        if not self.master_hosts:
            return True
        return any(h.lower() == host.lower() and p in (None, port) for h, p in self.master_hosts)

    def sentinel_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """redis-py's options for the connections to the Sentinels: the socket bounds of ``options`` (the
        master's), the Sentinels' credentials, and TLS verified against each sentinel's host as the URL names it."""
        asked = {key: options[key] for key in options if key.startswith("socket_") or key == "retry"}
        asked.update(username=self.sentinel_username, password=self.sentinel_password)
        if self.tls:
            asked.update({key: options[key] for key in options if key.startswith("ssl")})
        return asked

    def client_options(self) -> dict[str, Any]:
        """redis-py's connection options: every request bounded, keep-alives on, never a retry of its own."""
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        t = self.timing
        options: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "db": self.db,
            "username": self.username,
            "password": self.password,
            "socket_timeout": t.check_timeout,
            "socket_connect_timeout": t.connect_timeout,
            "socket_keepalive": True,
            "socket_keepalive_options": keepalive_options(t),
            # A retried script could run twice: the campaign decides what to do after an error.
            "retry": Retry(NoBackoff(), 0),  # type: ignore[no-untyped-call, unused-ignore]
        }
        if self.tls:
            options.update(
                ssl=True,
                ssl_cert_reqs="required",
                ssl_check_hostname=True,
                ssl_ca_certs=self.ssl_ca_certs,
                ssl_certfile=self.ssl_certfile,
                ssl_keyfile=self.ssl_keyfile,
            )
        return options


def _sentinel_credentials(
    options: dict[str, Any], sentinels: tuple[tuple[str, int], ...]
) -> tuple[str | None, str | None]:
    user = options.get("sentinel_username")
    password = options.get("sentinel_password")
    for key, value in (("sentinel_username", user), ("sentinel_password", password)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{key} must be a non-empty string or None")
    if not sentinels and ("sentinel_username" in options or "sentinel_password" in options):
        raise ValueError("sentinel_username and sentinel_password need a redis+sentinel:// URL")
    if user is not None and password is None:
        raise ValueError("sentinel_username needs sentinel_password")
    return (user, password) if sentinels else (None, None)


def _master_hosts(text: str | None) -> tuple[tuple[str, int | None], ...]:
    if text is None:
        return ()
    hosts: list[tuple[str, int | None]] = []
    for entry in text.split(","):
        # Only a host name, an IPv4 address or a bracketed IPv6 address, and a port: anything else (a path, a
        # query, white space) would be dropped by a URL parser and widen the list to every port of the host.
        if not _MASTER_HOST.fullmatch(entry):
            raise ValueError("master_hosts must list host or host:port (a name or an address), separated by commas")
        probe = parse_dsn(f"redis://{entry}/", "redis")
        if not probe.host or probe.user is not None:
            raise ValueError("master_hosts must list host or host:port, separated by commas")
        hosts.append((probe.host, probe.port))
    return tuple(hosts)


def _assumed(query: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The settings the URL states (``assume_appendfsync``, ``assume_timeout``) by their ``CONFIG`` names."""
    stated: list[tuple[str, str]] = []
    fsync = query.get("assume_appendfsync")
    if fsync is not None:
        if fsync not in _APPENDFSYNC:
            raise ValueError(f"assume_appendfsync must be one of {', '.join(_APPENDFSYNC)}, not {fsync!r}")
        stated.append(("appendfsync", fsync))
    timeout = query.get("assume_timeout")
    if timeout is not None:
        if not timeout.isascii() or not timeout.isdigit() or int(timeout) > 10**9:
            raise ValueError(f"assume_timeout must be the server's timeout in whole seconds (0: none), not {timeout!r}")
        stated.append(("timeout", str(int(timeout))))
    return tuple(stated)


def _split_hosts(
    url: str, schemes: dict[str, str], default_port: int, form: str, item: str
) -> tuple[str, str, str, str, list[tuple[str, int]], str]:
    """(plain scheme, ``userinfo@`` or "", path, ``?query`` or "", hosts, the first host as written) of a URL
    listing ``host:port,host:port``. ValueErrors never quote the URL."""
    scheme, _, rest = url.partition("://")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:end], rest[end:]
    if "@" in path:
        # The password held an unencoded '/' or '?': the user, host and master name would all be misread.
        raise ValueError(
            f"the {form} URL has an '@' after a '/' or '?', so where the password ends is ambiguous; percent-encode "
            "'/' as %2F and '?' as %3F in the user name and password"
        )
    userinfo, at, hosts = authority.rpartition("@")
    listed: list[tuple[str, int]] = []
    for entry in hosts.split(","):
        probe = parse_dsn(f"redis://{entry.strip()}/", "redis")
        if not probe.host:
            raise ValueError(f"a {form} URL must list host:port of each {item}, separated by commas")
        listed.append((probe.host, probe.port or default_port))
    query = ""
    if "?" in path:
        path, query = path.split("?", 1)
        query = "?" + query
    return schemes[scheme], f"{userinfo}{at}", path, query, listed, hosts.split(",")[0].strip()


def _sentinel_url(url: str) -> tuple[str, tuple[tuple[str, int], ...], str]:
    """``redis+sentinel://[user:password@]host:port[,host:port...]/master[/db][?...]`` as a plain URL (the first
    sentinel as its host), the sentinels and the master's name. ValueErrors never quote the URL."""
    scheme, auth, path, query, sentinels, first = _split_hosts(url, _SENTINEL_SCHEMES, 26379, "Sentinel", "sentinel")
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise ValueError("a Sentinel URL must name the master: redis+sentinel://host:port,host:port/master/db")
    master = parts[0]
    db = f"/{parts[1]}" if len(parts) == 2 else "/0"
    return f"{scheme}://{auth}{first}{db}{query}", tuple(sentinels), master


def _cluster_url(url: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """``redis+cluster://[user:password@]host:port[,host:port...][/][/0][?...]`` as a plain URL (the first node as
    its host) and the nodes. A Redis Cluster has database 0 only: any other path is refused."""
    scheme, auth, path, query, nodes, _ = _split_hosts(url, _CLUSTER_SCHEMES, 6379, "Redis Cluster", "node")
    parts = [p for p in path.split("/") if p]
    if parts not in ([], ["0"]):
        raise ValueError(
            "a Redis Cluster has database 0 only: the URL's path must be empty or /0 "
            "(redis+cluster://host:port,host:port/)"
        )
    host, port = nodes[0]
    return f"{scheme}://{auth}{_netloc(host, port)}/0{query}", tuple(nodes)


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _shown(
    parsed: DSN, sentinels: tuple[tuple[str, int], ...], master: str | None, cluster: tuple[tuple[str, int], ...]
) -> str:
    """The URL for messages, without the password."""
    if not sentinels and not cluster:
        return parsed.redacted()
    auth = f"{parsed.user or ''}:***@" if parsed.password is not None else (f"{parsed.user}@" if parsed.user else "")
    hosts = ",".join(_netloc(h, p) for h, p in (sentinels or cluster))
    if cluster:
        return f"{parsed.scheme}+cluster://{auth}{hosts}/"
    return f"{parsed.scheme}+sentinel://{auth}{hosts}/{master}/{parsed.database or 0}"


def keepalive_idle(timing: LockTiming) -> int:
    """Seconds of silence before the first keep-alive probe: about ``check_interval``, at least one."""
    return max(1, int(timing.check_interval))


def keepalive_options(timing: LockTiming) -> dict[int, int]:
    options: dict[int, int] = {}
    for opt, value in (
        ("TCP_KEEPIDLE", keepalive_idle(timing)),
        ("TCP_KEEPINTVL", 1),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
        number = getattr(socket, opt, None)
        if number is not None:
            options[number] = value
    return options
