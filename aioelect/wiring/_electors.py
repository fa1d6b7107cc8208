"""The electors users construct: each one an :class:`~aioelect.Elector` over one backend.

Each class builds its backend from the options that backend's module
defines and validates (``MySQLOptions``...), so every option is typed and
written once. A backend's module, with its driver, is imported only when
the first elector of that backend is built: ``import aioelect`` needs no
driver. Nothing below this module imports it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core._backend import Backend
from ..core._config import DEFAULT_NAME
from ..core._elector import Elector

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..backends.etcd import EtcdBackend, EtcdOptions, EtcdSession
    from ..backends.file import FileBackend, FileOptions
    from ..backends.local import LocalOptions
    from ..backends.memory import MemoryElection
    from ..backends.redis import RedisOptions
    from ..backends.sql.mysql import MySQLOptions, MySQLSession
    from ..backends.sql.postgres import PostgresOptions, PostgresSession

__all__ = [
    "EtcdElector",
    "FileElector",
    "LocalElector",
    "MemoryElector",
    "MySQLElector",
    "PostgresElector",
    "RedisElector",
]


class MySQLElector(Elector):
    """A candidate in a MySQL/MariaDB ``GET_LOCK`` election.

    Guarantees (beyond :class:`~aioelect.Elector`'s):

    * mutual exclusion as long as every candidate talks to the same server
      (``GET_LOCK`` is per server: not across replicas, Galera or Group
      Replication nodes, which are refused unless ``allow_unsafe_topology``);
    * a follower takes over within milliseconds of a release or of the
      leader's connection closing, and polls at most once per ``poll_interval``
      and at most once a second (each request waits on the server);
    * a new leadership starts with its whole ``renew_deadline`` ahead (see
      "When a leadership is dated from" in the concepts);
    * a leader whose connection is closed stops at once, one whose lock is
      gone within ``check_interval`` plus twice ``check_timeout``; one that
      cannot confirm for ``renew_deadline`` seconds fences itself; the server
      drops a silent leader after ``lease`` seconds;
    * with ``fencing`` (on by default) each leadership gets a token that
      increases across all leaders of ``name`` and across server restarts
      (table ``aioelect_leaders``, created if missing), and :meth:`leader`
      reports identities. It needs a database in the DSN (else ValueError at
      construction) and CREATE, SELECT, INSERT and UPDATE on it (else
      :class:`~aioelect.ElectionError` from :meth:`acquire`, naming them).
      With ``fencing=False`` tokens are None and :meth:`leader` reports the
      holder's connection.

    ``dsn`` is ``mysql://user:password@host:port/database``; keyword arguments
    override its parts. Special characters in the user name, password or
    database must be percent-encoded (``#`` as ``%23``, ``@`` as ``%40``,
    ``/`` as ``%2F``, ``?`` as ``%3F``): a DSN that could be read more than one
    way is a ValueError, which never shows the password.

    TLS: ``ssl`` takes an :class:`ssl.SSLContext`, or the DSN says
    ``?ssl_mode=VERIFY_IDENTITY&ssl_ca=PATH&ssl_cert=PATH&ssl_key=PATH`` (or
    ``ssl-mode``, ``ssl-ca``... as the MySQL clients spell them). Modes as
    MySQL's: VERIFY_IDENTITY (the default when a file is given), VERIFY_CA,
    REQUIRED (encrypted, server not verified), DISABLED. ``PREFERRED`` is
    refused: it falls back to plaintext silently and verifies nothing. Any
    other DSN parameter is a ValueError that names it. A refused certificate
    is a permanent error. An elector whose connection to a host other than
    this machine is unencrypted or unverified logs one WARNING when built.

    Options: :class:`~aioelect.backends.sql.mysql.MySQLOptions` (``name`` is required).

    ``session=`` instead of ``dsn``: campaign on a shared
    :class:`~aioelect.MySQLSession` (opt-in), whose one connection holds
    the lock of every elector on it; only ``name`` (with ``identity`` and
    ``stop_timeout``) is given then, and the identity defaults to the
    session's. What it gives up: the connection's loss ends the leadership of every
    elector on the session (see :class:`~aioelect.MySQLSession`).
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        session: MySQLSession | None = None,
        identity: str | None = None,
        stop_timeout: float = 5.0,
        **options: Unpack[MySQLOptions],
    ) -> None:
        from ..backends.sql.mysql import MySQLBackend

        if session is not None:
            _on_session(self, session, dsn, options, identity, stop_timeout)
            return
        super().__init__(MySQLBackend(dsn, **options), identity=identity, stop_timeout=stop_timeout)


def _on_session(
    elector: Elector,
    session: MySQLSession | PostgresSession,
    dsn: str | None,
    options: Any,
    identity: str | None,
    stop_timeout: float,
) -> None:
    """Build ``elector`` on a shared MySQL or PostgreSQL ``session``: its backend is the session's for ``name``."""
    who = type(elector).__name__
    if dsn is not None:
        raise ValueError(f"{who}: give either a DSN or session=, not both (the session says where to connect)")
    extra = sorted(set(options) - {"name"})
    if extra:
        raise TypeError(f"{who}() on a session takes only name= (the session has the options); got {extra}")
    if "name" not in options:
        raise TypeError(f"{who}() missing required keyword argument: 'name'")
    backend: Backend = session.backend(options["name"])
    chosen = identity if identity is not None else session.identity
    Elector.__init__(elector, backend, identity=chosen, stop_timeout=stop_timeout)
    session.join(backend.name, backend, elector.aclose)


class PostgresElector(Elector):
    """A candidate in a PostgreSQL advisory-lock election.

    Guarantees (beyond :class:`~aioelect.Elector`'s):

    * mutual exclusion as long as every candidate talks to the same primary
      and database (advisory locks are per server and per database; a standby
      is refused with :class:`~aioelect.ElectionError`);
    * a follower takes over within milliseconds of a release or of the
      leader's session ending, and sends at most one query per
      ``poll_interval`` while waiting;
    * a leader whose session ends stops at once; one whose lock check fails
      stops within ``check_interval`` plus twice ``check_timeout``; one that
      cannot confirm for ``renew_deadline`` seconds fences itself; the server ends a
      silent (frozen, cut off) leader's session after ``lease`` seconds
      (``idle_session_timeout``, PostgreSQL 14+; on older servers only TCP
      keepalives, which never end a stopped but live process);
    * with ``fencing`` (on by default) each leadership gets a token (the server's
      transaction id, taken once the lock is held and durable before it is
      returned) larger than every earlier leader's token of ``name`` on this
      server, across restarts and crashes; it needs no table and no privilege;
    * with ``schema="..."`` each leader also records its full identity and
      token in ``<schema>.aioelect_leaders`` (created if missing, which needs
      CREATE on the schema) and :meth:`leader` reports full identities;
      otherwise it reports ``application_name`` (63 bytes). The table must be
      owned by the connecting role and the schema by it or a superuser, else
      :class:`~aioelect.ElectionError` says who owns it: another owner could
      run code with our privileges. Nothing is ever looked up through the
      user's ``search_path``.

    Wrong passwords, unknown databases and missing privileges raise
    :class:`~aioelect.ElectionError` at once, naming the privilege and the
    option that avoids it; connection errors are retried with backoff.
    ``dsn`` is ``postgresql://user:password@host:port/database``
    (``postgres://`` too); keyword arguments override its parts.

    TLS follows libpq: ``sslmode`` (the DSN's, ``ssl="..."`` or
    ``PGSSLMODE``; default ``prefer``), ``sslrootcert``, ``sslcert``,
    ``sslkey`` (the DSN's, ``PGSSLROOTCERT``/``PGSSLCERT``/``PGSSLKEY`` or
    ``~/.postgresql/``). ``prefer`` encrypts when the server offers TLS and
    falls back to plaintext otherwise; without a root certificate it does not
    verify the server. With a root certificate ``require`` verifies the chain
    as ``verify-ca`` does; ``verify-full`` also checks the host name;
    ``sslrootcert=system`` (with ``verify-full``) uses the system's CAs. Two
    choices are stricter than libpq: a file named that does not exist is a
    ValueError, and a root certificate given without any sslmode means
    ``verify-full``. ``ssl`` may also be an :class:`ssl.SSLContext` (used as
    it is, never without TLS). A refused certificate, or a server without TLS
    when the mode requires it, is a permanent error. One WARNING is logged
    when the host is not loopback and the connection may be unencrypted or
    its server unverified.

    Options: :class:`~aioelect.backends.sql.postgres.PostgresOptions` (``name`` is required).

    ``session=`` instead of ``dsn``: campaign on a shared
    :class:`~aioelect.PostgresSession` (opt-in), whose one connection holds
    the advisory lock of every elector on it; only ``name`` (with
    ``identity`` and ``stop_timeout``) is given then, and the identity
    defaults to the session's: without ``schema=``, :meth:`leader` reports
    the session's identity (its ``application_name``), so give an elector
    another identity only with ``schema=``. What it gives up: the connection's loss ends the
    leadership of every elector on the session (see
    :class:`~aioelect.PostgresSession`).
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        session: PostgresSession | None = None,
        identity: str | None = None,
        stop_timeout: float = 5.0,
        **options: Unpack[PostgresOptions],
    ) -> None:
        from ..backends.sql.postgres import PostgresBackend

        if session is not None:
            _on_session(self, session, dsn, options, identity, stop_timeout)
            return
        super().__init__(PostgresBackend(dsn, **options), identity=identity, stop_timeout=stop_timeout)


class RedisElector(Elector):
    """A candidate in a Redis (or Valkey) election: a lock key with an expiry, renewed by its owner.

    Guarantees (beyond :class:`~aioelect.Elector`'s):

    * mutual exclusion as long as every candidate talks to the same server
      and no acknowledged write is lost: one atomic script sets the lock key
      (``SET NX PX``) and takes the token (``INCR``); Redis replication is
      asynchronous, so a failover to a replica that missed the grant can
      make two leaders (``min_replicas`` narrows it; the token still orders
      them, see the guarantees page);
    * :attr:`Leadership.token` increases from one leader to the next and
      across server crashes: a server that could lose the last token
      increment (no ``appendonly yes`` with ``appendfsync always``, no
      ``WAITAOF`` on 7.2+, or a user that may not run ``CONFIG GET``) is
      refused with :class:`~aioelect.PermanentBackendError` unless
      ``volatile_tokens=True``, which logs a WARNING; so is a server that
      could evict the lock key (a ``maxmemory-policy`` other than
      ``noeviction``) or close a connection between two renews (a short
      ``timeout``);
    * a release deletes the key only if it is ours and publishes it: a
      waiting candidate takes over within milliseconds; a crashed or cut-off
      leader's key expires after ``lease`` seconds;
    * a leader renews every ``check_interval`` by a script that *sets* the
      expiry, only on its own key: a key deleted, expired or changed is a
      loss, seen within ``check_interval`` plus ``check_timeout``; one that
      cannot renew for ``renew_deadline`` seconds fences itself, before its
      key can expire (every deadline is measured from the send time of the
      request that set the expiry);
    * cancelling a campaign leaves no key and no connection.

    ``url`` is ``redis://user:password@host:port/db`` or ``rediss://`` for TLS
    (the server's certificate always verified, against
    ``?ssl_ca_certs=PATH`` or the system CAs; ``ssl_certfile`` and
    ``ssl_keyfile`` for a client certificate);
    ``redis+sentinel://user:password@host:port,host:port/master/db`` asks
    Sentinel for the master, and ``redis+cluster://user:password@host:port,host:port/``
    reaches the Cluster master owning the election's slot (``rediss+`` for TLS).
    Special characters in the user
    name or password must be percent-encoded; a URL that could be read more
    than one way is a ValueError, which never shows the password.

    Options: :class:`~aioelect.backends.redis.RedisOptions` (``name`` is required).
    """

    def __init__(
        self,
        url: str,
        *,
        identity: str | None = None,
        stop_timeout: float = 5.0,
        **options: Unpack[RedisOptions],
    ) -> None:
        from ..backends.redis import RedisBackend

        super().__init__(RedisBackend(url, **options), identity=identity, stop_timeout=stop_timeout)


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

    Options: :class:`~aioelect.backends.etcd.EtcdOptions` (``name`` is required).

    ``session=`` instead of ``endpoints``: campaign on a shared
    :class:`~aioelect.EtcdSession` (opt-in), whose lease and connection
    every elector on it shares; only ``name`` (with ``identity`` and
    ``stop_timeout``) is given then. What it gives up: the lease's end ends
    the leadership of every elector on the session (see
    :class:`~aioelect.EtcdSession`).
    """

    def __init__(
        self,
        endpoints: str | Sequence[str] | None = None,
        *,
        session: EtcdSession | None = None,
        identity: str | None = None,
        stop_timeout: float = 5.0,
        **options: Unpack[EtcdOptions],
    ) -> None:
        from ..backends.etcd import EtcdBackend

        self._etcd: EtcdBackend = EtcdBackend(endpoints, session=session, **options)
        super().__init__(self._etcd, identity=identity, stop_timeout=stop_timeout)
        if session is not None:
            session.join(self._etcd.name, self._etcd, self.aclose)

    @property
    def renew_deadline(self) -> float:
        """Seconds a leader may go without an acknowledged keep-alive before it fences itself."""
        return self._etcd.renew_deadline


class FileElector(Elector):
    """A candidate in a single-host election on an exclusive ``flock``.

    Guarantees (beyond :class:`~aioelect.Elector`'s):

    * mutual exclusion between processes (and electors) **on one host**
      that use the same lock file ``path`` on a local file system (not NFS);
    * on Linux, a follower takes over within milliseconds of a release and
      of the leader's process dying for any reason (the kernel drops the
      lock and inotify reports the close), and a waiting follower costs
      nothing but one try per ``max(poll_interval, 1 s)``; where inotify is
      unavailable, followers try every ``poll_interval`` and take over within it;
    * a candidate that starts campaigning while others wait (a leader that
      released and campaigns again, or a newcomer) lets one of them take the
      lock first: it stays out until a waiter leaves the queue, at most
      ``min(2 * poll_interval, 0.25 s)``;
    * each leadership gets a token one higher than the previous one for this
      lock file, kept (fsynced) both in the lock file itself and in
      ``path + ".leader"`` with the identity: deleting the sidecar, or the
      lock file while nobody holds it, does not make tokens start again
      (deleting both does);
    * a leader loses leadership only if the lock file is deleted or replaced,
      noticed within ``check_interval``; there is no renew deadline, and a
      frozen leader keeps leadership until it resumes or dies;
    * other users cannot take part: the files are created with ``mode``
      (``0o600``, the owner only, by default; exactly that mode, whatever
      the umask), and every file is opened without following a symbolic
      link (``O_NOFOLLOW``) and without waiting (``O_NONBLOCK``), then
      checked: a regular file, owned by this process's user. Anything else
      at one of the paths (a symbolic link, a FIFO, a directory, a file of
      another user) is an :class:`~aioelect.ElectionError` naming the path
      and the problem, at once. A file of ours with a wider mode is
      narrowed to ``mode``, with a warning;
    * no file is opened, read or written on the event-loop thread (worker
      threads do it): a FIFO, a slow disk or a hung mount cannot stop the
      loop. Only non-blocking calls on descriptors already open (``flock``
      with ``LOCK_NB``, ``fstat``, ``close``) run on it.

    ``mode=0o660`` shares an election between the users of one group (read
    access alone is enough to hold a ``flock``, so there is no mode between
    the two): files of another
    user are then accepted if their group is one of this process's groups
    and their mode is not wider. Give the directory to that group, setgid
    (``chmod 2770``), so that new files belong to it; in a sticky directory
    (/tmp) users cannot replace each other's sidecar. Other users never get
    access: any of them could hold the lock forever.

    The directory must not let strangers replace files: one that every user
    may write to without the sticky bit is refused, and so is one owned by
    another user than this process's or root (with ``mode=0o660``: unless
    it belongs to one of our groups). /tmp (sticky) works, but
    any user can create the lock file there first, which then refuses every
    campaign (an error, not two leaders); prefer a directory of your own
    (``/run/<service>``, ``$XDG_RUNTIME_DIR``).

    ``name`` is only a label for logs and the sidecar. Besides the lock file,
    ``path + ".leader"`` and ``path + ".waiting"`` are created next to it and
    never deleted. A waiting candidate holds two descriptors (the lock file,
    ``.waiting``), and each event loop with waiting candidates one inotify
    instance (two watches per lock file). Raises ValueError at construction if ``mode`` is
    neither ``0o600`` nor ``0o660``; if ``path``'s directory does not exist,
    cannot be reached, is not a directory, is not writable (the sidecar is
    replaced there), may be written by every user without the sticky bit,
    or is owned by another user; if ``path`` is a directory; or if an
    existing lock file is not readable and writable. The same conditions
    arising later (directory removed, permissions changed) raise
    :class:`~aioelect.ElectionError` from :meth:`acquire`, at once.
    Construction looks at the directory (``stat``): construct electors
    before the event loop runs if that could block.

    Options: :class:`~aioelect.backends.file.FileOptions`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        identity: str | None = None,
        stop_timeout: float = 5.0,
        **options: Unpack[FileOptions],
    ) -> None:
        from ..backends.file import FileBackend

        self._file: FileBackend = FileBackend(path, **options)
        super().__init__(self._file, identity=identity, stop_timeout=stop_timeout)

    @property
    def path(self) -> str:
        """The absolute path of the lock file."""
        return self._file.path

    @property
    def sidecar(self) -> str:
        """The JSON file with the leader's ``identity``, ``token``, ``pid``, ``host`` and ``acquired_at``."""
        return self._file.sidecar


class LocalElector(Elector):
    """Always the leader at once: for a single instance in development.

    Offers no mutual exclusion between processes. Tokens increase within the
    process for each name. :meth:`leader` reports this elector's identity
    while it leads, None otherwise.

    Options: :class:`~aioelect.backends.local.LocalOptions`.
    """

    def __init__(
        self, *, identity: str | None = None, stop_timeout: float = 5.0, **options: Unpack[LocalOptions]
    ) -> None:
        from ..backends.local import LocalBackend

        super().__init__(LocalBackend(**options), identity=identity, stop_timeout=stop_timeout)


class MemoryElector(Elector):
    """A candidate in an in-memory election, shared by the electors of ``name`` in the running event loop.

    Importable from :mod:`aioelect.testing`; ``AIOELECT_BACKEND=memory`` makes
    :func:`aioelect.from_env` build one, so that tests of code that calls it
    need no server.

    Guarantees (beyond :class:`~aioelect.Elector`'s):

    * one leader at a time among the electors of ``name`` in one event loop;
      a candidate waiting takes over in the event loop iteration after a
      release, and candidates lead in the order they began to wait;
    * tokens of ``name`` increase by one with each leadership, from 1 in
      each event loop;
    * :meth:`observe` reports each change at once (no polling);
    * a leader confirms every ``check_interval`` seconds (default a quarter of
      ``renew_deadline``) and fences itself after ``renew_deadline`` seconds
      (default 0.5) without a confirmation: short, so that a test of a
      stalled or cut-off leader takes a fraction of a second. A test whose
      event loop is blocked for longer than ``renew_deadline`` sees the
      leadership fenced, as a real leader would be.

    The controls act on the election of ``name`` in the running event loop
    (whoever leads it) and must be called from code running in that loop.
    """

    def __init__(
        self,
        *,
        name: str = DEFAULT_NAME,
        identity: str | None = None,
        stop_timeout: float = 5.0,
        renew_deadline: float | None = None,
        check_interval: float | None = None,
    ) -> None:
        from ..backends.memory import DEFAULT_RENEW_DEADLINE, MemoryBackend

        backend = MemoryBackend(
            name,
            renew_deadline=DEFAULT_RENEW_DEADLINE if renew_deadline is None else renew_deadline,
            check_interval=check_interval,
        )
        Elector.__init__(self, backend, identity=identity, stop_timeout=stop_timeout)
        self._memory = backend

    @property
    def election(self) -> MemoryElection:
        """The shared state of this elector's election in the running event loop."""
        return self._memory.election()

    def depose(self, reason: str = "deposed by the test") -> str:
        """Take leadership away from whoever leads this election; return the deposed identity.

        The leader's leadership is lost at once with ``reason`` as its
        ``lost_reason``: its work is cancelled and ``async with
        leadership(...)`` raises :class:`~aioelect.LeadershipLost`. The first
        candidate waiting leads next. Raises :class:`LookupError` when nobody
        leads.
        """
        return self.election.depose(reason)

    def stall(self) -> str:
        """Stop the current leader's confirmations; return its identity.

        It fences itself ``renew_deadline`` seconds after its last
        confirmation (``lost_reason`` names the renew deadline), then lets go.
        Raises :class:`LookupError` when nobody leads.
        """
        return self.election.stall()

    def fail(self, reason: str = "memory server failed by the test") -> None:
        """Make this election's "server" unavailable until :meth:`restore`.

        Campaigns keep waiting and emit an ``error`` event (and a WARNING) each
        time they retry; :meth:`leader` raises
        :class:`~aioelect.BackendUnavailable`; the leader cannot confirm and
        fences itself at its renew deadline.
        """
        self.election.fail(reason)

    def restore(self) -> None:
        """Undo :meth:`fail` and :meth:`stall`: waiting campaigns go on at once."""
        self.election.restore()
