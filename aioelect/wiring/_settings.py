"""aioelect's environment variables: every name defined here once, read into one typed settings object.

:func:`aioelect.from_env` and the ``aioelect`` command both read the
environment through :meth:`Settings.from_environ`. This module guarantees:

* every ``AIOELECT_*`` variable the library and the command read is named
  by a constant here, and nowhere else;
* an empty variable means unset;
* a value that cannot be read raises ValueError naming the variable and
  never quoting the value of a secret variable;
* a secret (a password, or a DSN that may hold one) never appears in the
  ``repr()`` of :class:`Settings`;
* :func:`is_secret` says which variables are secrets (aioelect's, and every
  libpq, MySQL and MariaDB client variable), so that the command keeps them
  out of the environment of the programs it starts.

It imports nothing of aioelect's but :mod:`aioelect.core._config`, so every
layer may use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core._config import redact_dsn

__all__ = [
    "BACKEND_KINDS",
    "BACKEND_VARIABLES",
    "BACKEND_OPTION_VARIABLES",
    "ENV_ALLOW_UNSAFE_TOPOLOGY",
    "ENV_ALLOW_VOLATILE_TOKENS",
    "ENV_BACKEND",
    "ENV_CHECK_INTERVAL",
    "ENV_CHECK_TIMEOUT",
    "ENV_CONNECT_TIMEOUT",
    "ENV_ETCD_CA",
    "ENV_ETCD_CERT",
    "ENV_ETCD_DEGRADE_TO_LOCAL",
    "ENV_ETCD_ENDPOINTS",
    "ENV_ETCD_KEY",
    "ENV_ETCD_USER",
    "ENV_FENCING",
    "ENV_FILE",
    "ENV_FILE_MODE",
    "ENV_IDENTITY",
    "ENV_KEY_PREFIX",
    "ENV_LEASE",
    "ENV_MIN_REPLICAS",
    "ENV_MYSQL_DSN",
    "ENV_NAME",
    "ENV_PASSWORD",
    "ENV_HEALTH_URL",
    "ENV_POLL_INTERVAL",
    "ENV_POSTGRES_DSN",
    "ENV_REDIS_URL",
    "ENV_RENEW_DEADLINE",
    "ENV_SCHEMA",
    "ENV_TOKEN",
    "LIBPQ_VARIABLES",
    "MYSQL_PREFIXES",
    "SECRET_VARIABLES",
    "Settings",
    "TIMING_VARIABLES",
    "file_mode",
    "is_secret",
]

#: The backend to use, by kind: ``etcd``, ``mysql``, ``postgres``, ``redis``, ``file``, ``local`` or ``memory``.
#: Required for ``local`` and ``memory`` (no mutual exclusion between processes: never chosen because nothing
#: else is configured); with another kind, that backend's variable is used even when others are set.
ENV_BACKEND = "AIOELECT_BACKEND"
#: Comma-separated etcd endpoints (``host:port`` or ``https://host:port``).
ENV_ETCD_ENDPOINTS = "AIOELECT_ETCD_ENDPOINTS"
#: ``mysql://user:password@host:port/database``.
ENV_MYSQL_DSN = "AIOELECT_MYSQL_DSN"
#: ``postgresql://user:password@host:port/database``.
ENV_POSTGRES_DSN = "AIOELECT_POSTGRES_DSN"
#: ``redis://user:password@host:port/db`` or ``rediss://...`` (TLS), ``redis+sentinel://...`` or ``redis+cluster://...``.
ENV_REDIS_URL = "AIOELECT_REDIS_URL"
#: The path of a lock file (one machine only).
ENV_FILE = "AIOELECT_FILE"
#: The election name (lock name or etcd key prefix).
ENV_NAME = "AIOELECT_NAME"
#: This candidate's identity.
ENV_IDENTITY = "AIOELECT_IDENTITY"
#: The password of the DSN's user or of the etcd user.
ENV_PASSWORD = "AIOELECT_PASSWORD"
#: The etcd user name.
ENV_ETCD_USER = "AIOELECT_ETCD_USER"
#: Redis Sentinel: the Sentinels' own user and password (the URL's are the master's); no flag: a password on a
#: command line is visible to every user of the host.
ENV_REDIS_SENTINEL_USERNAME = "AIOELECT_REDIS_SENTINEL_USERNAME"
ENV_REDIS_SENTINEL_PASSWORD = "AIOELECT_REDIS_SENTINEL_PASSWORD"
#: etcd over TLS: the CA certificate (PEM) that verifies the server.
ENV_ETCD_CA = "AIOELECT_ETCD_CA"
#: etcd over TLS: the client certificate (PEM).
ENV_ETCD_CERT = "AIOELECT_ETCD_CERT"
#: etcd over TLS: the client certificate's unencrypted key (PEM).
ENV_ETCD_KEY = "AIOELECT_ETCD_KEY"
#: Opt-in to etcd's local leadership (without mutual exclusion) while etcd has never answered.
ENV_ETCD_DEGRADE_TO_LOCAL = "AIOELECT_ETCD_DEGRADE_TO_LOCAL"
#: The timing options every backend reads where it has them, in seconds (see :func:`aioelect.new`):
#: how long a silent leader keeps the election (MySQL ``wait_timeout``, PostgreSQL ``idle_session_timeout``,
#: etcd's lease TTL),
ENV_LEASE = "AIOELECT_LEASE"
#: how long a leader may go without a confirmation before it fences itself,
ENV_RENEW_DEADLINE = "AIOELECT_RENEW_DEADLINE"
#: how often a follower tries,
ENV_POLL_INTERVAL = "AIOELECT_POLL_INTERVAL"
#: how often a leader confirms,
ENV_CHECK_INTERVAL = "AIOELECT_CHECK_INTERVAL"
#: how long one confirmation may take,
ENV_CHECK_TIMEOUT = "AIOELECT_CHECK_TIMEOUT"
#: and how long connecting may take.
ENV_CONNECT_TIMEOUT = "AIOELECT_CONNECT_TIMEOUT"
#: Each timing variable with the option it sets.
TIMING_VARIABLES = (
    (ENV_LEASE, "lease"),
    (ENV_RENEW_DEADLINE, "renew_deadline"),
    (ENV_POLL_INTERVAL, "poll_interval"),
    (ENV_CHECK_INTERVAL, "check_interval"),
    (ENV_CHECK_TIMEOUT, "check_timeout"),
    (ENV_CONNECT_TIMEOUT, "connect_timeout"),
)
#: MySQL and PostgreSQL: ``0``/``false``/``no``/``off`` gives no fencing tokens and records no identities.
ENV_FENCING = "AIOELECT_FENCING"
#: MySQL: accept Galera and Group Replication, where ``GET_LOCK`` is per node: two leaders at once are possible.
ENV_ALLOW_UNSAFE_TOPOLOGY = "AIOELECT_ALLOW_UNSAFE_TOPOLOGY"
#: MySQL and Redis: accept fencing tokens that a server crash can hand out twice (logged at WARNING).
ENV_ALLOW_VOLATILE_TOKENS = "AIOELECT_ALLOW_VOLATILE_TOKENS"
#: Redis: grant only once ``WAIT`` says this many replicas have the lock and the token.
ENV_MIN_REPLICAS = "AIOELECT_MIN_REPLICAS"
#: Redis: the prefix of every key and channel (default ``aioelect:``).
ENV_KEY_PREFIX = "AIOELECT_KEY_PREFIX"
#: PostgreSQL: the schema of the ``aioelect_leaders`` table that records full identities.
ENV_SCHEMA = "AIOELECT_SCHEMA"
#: The file backend: the lock files' mode, ``600`` (the owner only, the default) or ``660`` (a group's users too).
ENV_FILE_MODE = "AIOELECT_FILE_MODE"
#: Set by ``aioelect run`` in the environment of the command it runs: the fencing token of its leadership.
ENV_TOKEN = "AIOELECT_TOKEN"
#: Set by ``aioelect shards`` in the environment of each command it runs: the shard (name) it owns.
ENV_SHARD = "AIOELECT_SHARD"
#: A candidate's priority (:meth:`aioelect.Elector.set_priority`).
ENV_PRIORITY = "AIOELECT_PRIORITY"
#: ``aioelect run`` / ``shards`` ``--health-url`` where the URL holds a password: kept out of ``ps`` and CMD.
ENV_HEALTH_URL = "AIOELECT_HEALTH_URL"

#: The backends in the factory's priority order, each with the variable that configures it.
BACKEND_VARIABLES = (
    ("etcd", ENV_ETCD_ENDPOINTS),
    ("mysql", ENV_MYSQL_DSN),
    ("postgres", ENV_POSTGRES_DSN),
    ("redis", ENV_REDIS_URL),
    ("file", ENV_FILE),
)

#: Each backend's own variable: the variable, its key (the command's flag is ``--key-with-dashes``), the option it
#: sets on each backend that has it (by kind), and how its text is read ("flag": yes or no; "count": a whole number
#: >= 0; "mode": octal 600 or 660; "text").
BACKEND_OPTION_VARIABLES: tuple[tuple[str, str, dict[str, str], str], ...] = (
    (ENV_FENCING, "fencing", {"mysql": "fencing", "postgres": "fencing"}, "flag"),
    (ENV_ALLOW_UNSAFE_TOPOLOGY, "allow_unsafe_topology", {"mysql": "allow_unsafe_topology"}, "flag"),
    (
        ENV_ALLOW_VOLATILE_TOKENS,
        "allow_volatile_tokens",
        {"mysql": "allow_volatile_tokens", "redis": "volatile_tokens"},
        "flag",
    ),
    (ENV_MIN_REPLICAS, "min_replicas", {"redis": "min_replicas"}, "count"),
    (ENV_KEY_PREFIX, "key_prefix", {"redis": "key_prefix"}, "text"),
    (ENV_REDIS_SENTINEL_USERNAME, "sentinel_username", {"redis": "sentinel_username"}, "text"),
    (ENV_REDIS_SENTINEL_PASSWORD, "sentinel_password", {"redis": "sentinel_password"}, "text"),
    (ENV_SCHEMA, "schema", {"postgres": "schema"}, "text"),
    (ENV_FILE_MODE, "file_mode", {"file": "mode"}, "mode"),
)

#: The values ``AIOELECT_BACKEND`` accepts.
BACKEND_KINDS = (*(kind for kind, _ in BACKEND_VARIABLES), "local", "memory")

#: The secret variables aioelect defines. Any other ``AIOELECT_`` variable whose name holds
#: ``PASSWORD`` or ends in ``_DSN`` or ``_URL`` is a secret too (see :func:`is_secret`).
SECRET_VARIABLES = (
    ENV_PASSWORD,
    ENV_MYSQL_DSN,
    ENV_POSTGRES_DSN,
    ENV_REDIS_URL,
    ENV_REDIS_SENTINEL_PASSWORD,
    ENV_HEALTH_URL,
)

#: libpq's environment variables (PostgreSQL's client library, read by psql and every libpq client, and in part
#: by asyncpg): the password, the password and service files, and what they connect to and how.
LIBPQ_VARIABLES = (
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGDATABASE",
    "PGUSER",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGREQUIREAUTH",
    "PGCHANNELBINDING",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGOPTIONS",
    "PGAPPNAME",
    "PGSSLMODE",
    "PGREQUIRESSL",
    "PGSSLNEGOTIATION",
    "PGSSLCOMPRESSION",
    "PGSSLCERT",
    "PGSSLKEY",
    "PGSSLCERTMODE",
    "PGSSLROOTCERT",
    "PGSSLCRL",
    "PGSSLCRLDIR",
    "PGSSLSNI",
    "PGREQUIREPEER",
    "PGSSLMINPROTOCOLVERSION",
    "PGSSLMAXPROTOCOLVERSION",
    "PGGSSENCMODE",
    "PGKRBSRVNAME",
    "PGGSSLIB",
    "PGGSSDELEGATION",
    "PGCONNECT_TIMEOUT",
    "PGCLIENTENCODING",
    "PGTARGETSESSIONATTRS",
    "PGLOADBALANCEHOSTS",
    "PGMINPROTOCOLVERSION",
    "PGMAXPROTOCOLVERSION",
    "PGDATESTYLE",
    "PGTZ",
    "PGGEQO",
    "PGSYSCONFDIR",
    "PGLOCALEDIR",
)
#: The prefixes of the MySQL and MariaDB clients' variables (``MYSQL_PWD``, ``MYSQL_HOST``,
#: ``MYSQL_TEST_LOGIN_FILE``, ``LIBMYSQL_ENABLE_CLEARTEXT_PLUGIN``...) and of the servers' images
#: (``MYSQL_ROOT_PASSWORD``, ``MARIADB_PASSWORD``...).
MYSQL_PREFIXES = ("MYSQL_", "MARIADB_", "LIBMYSQL_")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def is_secret(variable: str) -> bool:
    """Whether ``variable`` may hold a secret: aioelect's (a password, or a DSN or URL that may carry one), or a
    database client's (every libpq variable of :data:`LIBPQ_VARIABLES`, every MySQL or MariaDB variable of
    :data:`MYSQL_PREFIXES`: passwords, password files, and where they are sent)."""
    return (
        variable in SECRET_VARIABLES
        or (
            variable.startswith("AIOELECT_")
            and ("PASSWORD" in variable or variable.endswith("_DSN") or variable.endswith("_URL"))
        )
        or variable in LIBPQ_VARIABLES
        or variable.startswith(MYSQL_PREFIXES)
    )


def _flag(environ: Mapping[str, str], variable: str) -> bool | None:
    """The boolean in ``variable`` (None when unset or empty); ValueError for anything but a clear yes or no."""
    value = environ.get(variable, "").strip()
    if not value:
        return None
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"{variable} must be one of {', '.join(_TRUE + _FALSE)}, not {value!r}")


def _seconds(environ: Mapping[str, str], variable: str) -> float | None:
    """The number of seconds in ``variable`` (None when unset or empty); ValueError unless finite and > 0."""
    value = environ.get(variable, "").strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{variable} must be a number of seconds, not {value!r}") from None
    if not (0 < number < float("inf")):
        raise ValueError(f"{variable} must be a finite number of seconds > 0, not {value!r}")
    return number


def _count(environ: Mapping[str, str], variable: str) -> int | None:
    """The whole number >= 0 in ``variable`` (None when unset or empty); ValueError for anything else."""
    value = environ.get(variable, "").strip()
    if not value:
        return None
    if not value.isascii() or not value.isdigit():
        raise ValueError(f"{variable} must be a whole number >= 0, not {value!r}")
    return int(value)


def file_mode(text: str, what: str) -> int:
    """The lock files' mode in ``text`` (``600``, ``0600``, ``0o660``...): 0o600 or 0o660; ValueError naming
    ``what`` (the variable or flag) for anything else."""
    digits = text.strip().lower().removeprefix("0o")
    try:
        mode = int(digits, 8) if digits.isascii() and digits.isdigit() else -1
    except ValueError:  # an 8 or a 9
        mode = -1
    if mode not in (0o600, 0o660):
        raise ValueError(
            f"{what} must be 600 (the owner only) or 660 (the users of the file's group too), not {text.strip()!r}"
        )
    return mode


def _backend_option(environ: Mapping[str, str], variable: str, how: str) -> Any:
    """The value of a variable of :data:`BACKEND_OPTION_VARIABLES` (None when unset or empty)."""
    if how == "flag":
        return _flag(environ, variable)
    if how == "count":
        return _count(environ, variable)
    value = environ.get(variable, "").strip()
    if not value:
        return None
    return file_mode(value, variable) if how == "mode" else value


def _redacted(value: str | None) -> str | None:
    return None if value is None else redact_dsn(value)


@dataclass(frozen=True)
class Settings:
    """What aioelect's environment variables say; None for a variable unset or empty.

    Values are kept as given (a DSN with its password, endpoints as one
    comma-separated string); the consumers validate them. ``repr()`` shows
    DSNs redacted and never the password.
    """

    #: ``AIOELECT_BACKEND``: one of :data:`BACKEND_KINDS`.
    backend_kind: str | None = None
    etcd_endpoints: str | None = None
    mysql_dsn: str | None = field(default=None, repr=False)
    postgres_dsn: str | None = field(default=None, repr=False)
    redis_url: str | None = field(default=None, repr=False)
    file: str | None = None
    name: str | None = None
    identity: str | None = None
    password: str | None = field(default=None, repr=False)
    etcd_user: str | None = None
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    #: ``AIOELECT_ETCD_DEGRADE_TO_LOCAL``: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``.
    etcd_degrade_to_local: bool | None = None
    #: The timing options of :data:`TIMING_VARIABLES` that are set, by option name.
    timing: dict[str, float] = field(default_factory=dict)
    #: The variables of :data:`BACKEND_OPTION_VARIABLES` that are set, with their values.
    backend_variables: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """Read ``environ``; ValueError (naming the variable) for a value that cannot be read."""

        def text(variable: str) -> str | None:
            return environ.get(variable) or None

        kind = text(ENV_BACKEND)
        if kind is not None:
            kind = kind.strip().lower()
            if kind not in BACKEND_KINDS:
                raise ValueError(f"{ENV_BACKEND} must be one of {', '.join(BACKEND_KINDS)}, not {kind!r}")
        return cls(
            backend_kind=kind,
            etcd_endpoints=text(ENV_ETCD_ENDPOINTS),
            mysql_dsn=text(ENV_MYSQL_DSN),
            postgres_dsn=text(ENV_POSTGRES_DSN),
            redis_url=text(ENV_REDIS_URL),
            file=text(ENV_FILE),
            name=text(ENV_NAME),
            identity=text(ENV_IDENTITY),
            password=text(ENV_PASSWORD),
            etcd_user=text(ENV_ETCD_USER),
            etcd_ca=text(ENV_ETCD_CA),
            etcd_cert=text(ENV_ETCD_CERT),
            etcd_key=text(ENV_ETCD_KEY),
            etcd_degrade_to_local=_flag(environ, ENV_ETCD_DEGRADE_TO_LOCAL),
            timing={
                option: seconds
                for variable, option in TIMING_VARIABLES
                if (seconds := _seconds(environ, variable)) is not None
            },
            backend_variables={
                variable: value
                for variable, _, _, how in BACKEND_OPTION_VARIABLES
                if (value := _backend_option(environ, variable, how)) is not None
            },
        )

    def backend_options(self, kind: str) -> tuple[dict[str, Any], list[str]]:
        """The options the backend variables set give the ``kind`` backend, and the variables set that mean
        nothing to it."""
        options: dict[str, Any] = {}
        ignored: list[str] = []
        for variable, _, by_kind, _ in BACKEND_OPTION_VARIABLES:
            if variable in self.backend_variables:
                if kind in by_kind:
                    options[by_kind[kind]] = self.backend_variables[variable]
                else:
                    ignored.append(variable)
        return options, ignored

    @property
    def targets(self) -> dict[str, str | None]:
        """Each backend's configured target (endpoints, DSN, path) or None, in the factory's priority order."""
        return {
            "etcd": self.etcd_endpoints,
            "mysql": self.mysql_dsn,
            "postgres": self.postgres_dsn,
            "redis": self.redis_url,
            "file": self.file,
        }

    def backend(self) -> tuple[str, str] | None:
        """``(kind, target)`` of the backend ``AIOELECT_BACKEND`` names, else of the first backend configured in
        priority order; None if none is (or ``AIOELECT_BACKEND=local`` or ``memory``: no backend of another
        process).

        ValueError when ``AIOELECT_BACKEND`` names a backend whose variable is
        not set: the configuration contradicts itself, and falling back to
        another backend that happens to be set would lead beside the real
        election.
        """
        if self.backend_kind in ("local", "memory"):
            return None
        if self.backend_kind is not None:
            named = self.targets[self.backend_kind]
            if named is None:
                variable = dict(BACKEND_VARIABLES)[self.backend_kind]
                raise ValueError(f"{ENV_BACKEND}={self.backend_kind} but {variable} is not set")
            return self.backend_kind, named
        for kind, target in self.targets.items():
            if target is not None:
                return kind, target
        return None

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={value!r}"
            for name, value in (
                ("backend_kind", self.backend_kind),
                ("etcd_endpoints", self.etcd_endpoints),
                ("mysql_dsn", _redacted(self.mysql_dsn)),
                ("postgres_dsn", _redacted(self.postgres_dsn)),
                ("redis_url", _redacted(self.redis_url)),
                ("file", self.file),
                ("name", self.name),
                ("identity", self.identity),
                ("password", None if self.password is None else "***"),
                ("etcd_user", self.etcd_user),
                ("etcd_ca", self.etcd_ca),
                ("etcd_cert", self.etcd_cert),
                ("etcd_key", self.etcd_key),
                ("etcd_degrade_to_local", self.etcd_degrade_to_local),
                ("timing", self.timing),
                ("backend_variables", {k: "***" if is_secret(k) else v for k, v in self.backend_variables.items()}),
            )
        )
        return f"Settings({shown})"
