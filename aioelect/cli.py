"""The ``aioelect`` command (also ``python -m aioelect``).

* ``aioelect run [options] -- CMD [ARGS...]`` campaigns and runs CMD only
  while this process leads; see :func:`main` and ``aioelect run --help``.
* ``aioelect leader`` prints the current leader's identity (exit 1: none).
* ``aioelect observe`` prints one line per leadership change until interrupted.

Passwords come only from ``AIOELECT_PASSWORD`` or ``--password-file`` (or
inside a DSN); they are never printed: every message this command writes is
scrubbed of them, and every DSN it shows is redacted by text. Text that came
from a server (identities, error messages) is printed with its control and
other non-printable characters escaped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import ctypes
import datetime
import json
import logging
import math
import os
import shutil
import signal
import sys
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar, cast
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import anyio

from ._backend import Backoff
from ._config import redact_dsn
from ._elector import Elector, Leadership
from ._errors import BackendUnavailable, ElectionError

__all__ = ["EXIT_BACKEND", "EXIT_NO_LEADER", "EXIT_USAGE", "main"]

#: ``leader``: nobody leads.
EXIT_NO_LEADER = 1
#: Bad options or configuration (argparse's own code for usage errors).
EXIT_USAGE = 2
#: The backend is unreachable, refused us (wrong password, unknown database) or its driver is missing.
EXIT_BACKEND = 3
#: ``run``: CMD could not be executed / was not found (the shell's codes).
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

ENV_ETCD = "AIOELECT_ETCD_ENDPOINTS"
ENV_MYSQL = "AIOELECT_MYSQL_DSN"
ENV_POSTGRES = "AIOELECT_POSTGRES_DSN"
ENV_FILE = "AIOELECT_FILE"
ENV_NAME = "AIOELECT_NAME"
ENV_IDENTITY = "AIOELECT_IDENTITY"
ENV_PASSWORD = "AIOELECT_PASSWORD"
ENV_ETCD_USER = "AIOELECT_ETCD_USER"
ENV_ETCD_CA = "AIOELECT_ETCD_CA"
ENV_ETCD_CERT = "AIOELECT_ETCD_CERT"
ENV_ETCD_KEY = "AIOELECT_ETCD_KEY"
#: Set in CMD's environment by ``run``.
ENV_TOKEN = "AIOELECT_TOKEN"

#: aioelect's secret variables: ``run`` keeps them out of CMD's environment unless ``--pass-secret NAME``.
#: Any other ``AIOELECT_`` variable whose name holds ``PASSWORD`` or ends in ``_DSN`` is withheld too.
SECRET_ENV = (ENV_PASSWORD, ENV_MYSQL, ENV_POSTGRES)

#: Backends in the factory's priority order, with their option and variable.
_BACKENDS = (("etcd", ENV_ETCD), ("mysql", ENV_MYSQL), ("postgres", ENV_POSTGRES), ("file", ENV_FILE))

log = logging.getLogger("aioelect.cli")

#: Seconds of the safety margin kept for a loss to be noticed and SIGKILL to take effect.
_KILL_RESERVE = 0.5
#: --grace where leadership cannot be taken away while this process lives (file backend).
_DEFAULT_GRACE = 10.0
#: How long processes killed with SIGKILL get to be gone.
_KILL_WAIT = 2.0

#: Variables this process set in its own environment, kept out of CMD's.
_ADDED_ENV: list[str] = []

_EPILOG = f"""\
backend selection:
  Give one of --etcd, --mysql, --postgres or --file. Without any, the
  environment is read like aioelect.from_env(): {ENV_ETCD},
  {ENV_MYSQL}, {ENV_POSTGRES}, {ENV_FILE}, in that
  priority. A backend named on the command line replaces the environment's.

environment:
  {ENV_ETCD:<24} comma-separated etcd endpoints (host:port or https://host:port)
  {ENV_MYSQL:<24} mysql://user@host:port/database
  {ENV_POSTGRES:<24} postgresql://user@host:port/database
  {ENV_FILE:<24} path of a lock file (one machine only)
  {ENV_NAME:<24} election name (lock name / key prefix)
  {ENV_IDENTITY:<24} this candidate's identity (default hostname:pid:random)
  {ENV_PASSWORD:<24} password for the DSN's user or the etcd user; never printed
  {ENV_ETCD_USER:<24} etcd user name
  {ENV_ETCD_CA:<24} etcd: CA certificate (PEM) that verifies the server
  {ENV_ETCD_CERT:<24} etcd: client certificate (PEM), with {ENV_ETCD_KEY}
  {ENV_ETCD_KEY:<24} etcd: the client certificate's unencrypted key (PEM)

TLS:
  etcd        https:// endpoints, or --etcd-ca/--etcd-cert/--etcd-key (which
              imply TLS for endpoints without a scheme). Without --etcd-ca
              the system CAs verify the server.
  MySQL       in the DSN: ?ssl-ca=PATH&ssl-cert=PATH&ssl-key=PATH
              &ssl-mode=VERIFY_IDENTITY (or VERIFY_CA, REQUIRED, DISABLED)
  PostgreSQL  in the DSN: ?sslmode=verify-full&sslrootcert=PATH&sslcert=PATH
              &sslkey=PATH (libpq's names and modes)
  A certificate that is refused or not trusted exits with status 3 at once.

metrics (run):
  --metrics-port PORT serves Prometheus metrics on http://HOST:PORT/metrics
  (HOST: --metrics-host, default 127.0.0.1), e.g. aioelect_is_leader 1.0
  while this process leads; needs prometheus-client (aioelect[prometheus]).

exit status:
  0    success (observe: interrupted by SIGINT/SIGTERM)
  1    leader: there is no leader
  2    bad usage or configuration
  3    backend unreachable, refused (wrong password, unknown database...),
       or its driver not installed
  run: CMD's exit status; 128+N when CMD died of signal N (143: SIGTERM,
       137: SIGKILL), or when aioelect was stopped by signal N before CMD
       started; 126/127 when CMD cannot be executed / is not found.
"""

_RUN_DESCRIPTION = f"""\
Campaign, and run CMD only while this process is the leader.

* SIGINT and SIGTERM are forwarded to CMD (to its process group); aioelect
  then exits with CMD's status. Before CMD starts they stop the campaign.
* If leadership is lost, CMD's process group gets SIGTERM, then SIGKILL after
  --grace seconds, and the lock is released only once the group is gone.
  --grace must end before the lock can pass to another candidate: at most
  the backend's safety margin (lease less renew deadline: 3s on MySQL and
  PostgreSQL with the default --lease, 1.67s on etcd with the default --ttl)
  less {_KILL_RESERVE:g}s; by default half the margin.
* When CMD exits, processes it left in its process group are stopped the
  same way before the leadership is released.
* Without --forever, aioelect exits with CMD's status once CMD ends; with
  --forever it campaigns again (after --restart-delay) until interrupted.
* CMD runs in its own process group and is killed (SIGKILL) if aioelect
  itself dies (Linux), so a crashed supervisor never leaves CMD running.
* CMD's environment gets {ENV_IDENTITY} (ours) and {ENV_TOKEN} (the
  fencing token of this leadership, empty if the backend has none). It does
  not get aioelect's secrets unless --pass-secret NAME: {ENV_PASSWORD},
  {ENV_MYSQL}, {ENV_POSTGRES}, and any other AIOELECT_*
  variable whose name holds PASSWORD or ends in _DSN.
"""


class UsageError(Exception):
    """Bad options or configuration: exit status 2."""


class BackendError(Exception):
    """Backend unreachable, refused or unusable: exit status 3."""


# --- secrets ------------------------------------------------------------------------


class _Secrets:
    """Every secret this process was given, to scrub from anything it prints."""

    def __init__(self) -> None:
        self._values: set[str] = set()

    def add(self, value: str | None) -> None:
        if value:
            for form in {value, unquote(value)}:
                self._values.update({form, quote(form, safe=""), quote(form)})

    def scrub(self, text: str) -> str:
        for value in sorted(self._values, key=len, reverse=True):
            text = text.replace(value, "***")
        return text


_secrets = _Secrets()


class _ScrubbingFormatter(logging.Formatter):
    """Log lines as :func:`_shown` makes them; only a traceback keeps its line breaks."""

    def format(self, record: logging.LogRecord) -> str:
        record = copy.copy(record)
        record.msg, record.args = _escape(record.getMessage()), None
        return _secrets.scrub(redact_dsn(super().format(record)))


def _dsn_password(dsn: str) -> str | None:
    """The password of ``dsn`` found by text (after the first ``:`` between ``://`` and the last ``@``).

    Read by text rather than parsed, so that a DSN that does not parse
    (an unencoded ``#``, ``/``, ``?`` or ``@``) still has all of it scrubbed.
    """
    start, end = dsn.find("://"), dsn.rfind("@")
    if start < 0 or end < start + 3:
        return None
    _, colon, password = dsn[start + 3 : end].partition(":")
    return password if colon and password else None


def _escape(text: str) -> str:
    """``text`` with control and other non-printable characters as ``\\xNN``/``\\uNNNN`` escapes.

    Identities and server messages come from other clients: printed as they
    are, they could move the cursor, rewrite the terminal or forge lines.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape_char(c) for c in text)


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _shown(text: str) -> str:
    """``text`` as this command may print it: DSNs redacted, secrets scrubbed, non-printables escaped."""
    return _escape(_secrets.scrub(redact_dsn(text)))


def _with_password(dsn: str, password: str) -> str:
    """``dsn`` with its password replaced by ``password`` (URL-quoted)."""
    parts = urlsplit(dsn)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0] if at else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{hostport}"))


# --- configuration ------------------------------------------------------------------


@dataclass
class Config:
    """A backend chosen from options and environment, ready to build electors."""

    kind: str
    target: str | list[str]
    #: Where the backend is, for messages (never with a password).
    where: str
    options: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Elector:
        """Build an elector; raise :class:`UsageError` or :class:`BackendError`."""
        from ._factory import new

        kwargs: dict[str, Any] = {self.kind: self.target, **self.options}
        try:
            return new(**kwargs)
        except ImportError as exc:
            raise BackendError(str(exc)) from None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        except TypeError as exc:
            text = str(exc)
            if "unexpected keyword argument" not in text:
                raise
            for option in self.options:
                if repr(option) in text:
                    flag = "--" + option.replace("_", "-")
                    raise UsageError(f"{flag} does not apply to the {self.kind} backend") from None
            raise UsageError(f"the {self.kind} backend rejected an option: {text}") from None


def _read_password(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    if args.password_file is not None:
        try:
            with open(args.password_file, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise UsageError(f"cannot read --password-file {args.password_file}: {exc.strerror}") from None
        password = text.rstrip("\r\n")
        if not password:
            raise UsageError(f"--password-file {args.password_file} is empty")
        return password
    return environ.get(ENV_PASSWORD) or None


def configure(args: argparse.Namespace, environ: Mapping[str, str]) -> Config:
    """Choose the backend and its options from ``args``, then ``environ``."""
    given = [kind for kind, _ in _BACKENDS if getattr(args, kind) is not None]
    if len(given) > 1:
        raise UsageError("give only one of " + ", ".join("--" + kind for kind in given))
    if given:
        kind = given[0]
        value: str = getattr(args, kind)
    else:
        found = [(kind, environ[var]) for kind, var in _BACKENDS if environ.get(var)]
        if not found:
            raise UsageError(
                "no backend configured: give --etcd, --mysql, --postgres or --file "
                f"(or set {ENV_ETCD}, {ENV_MYSQL}, {ENV_POSTGRES} or {ENV_FILE})"
            )
        kind, value = found[0]
    if not value.strip():
        raise UsageError(f"--{kind} needs a value")
    password = _read_password(args, environ)
    _secrets.add(password)
    options: dict[str, Any] = {}
    for flag in ("name", "identity"):
        if getattr(args, flag) == "":
            raise UsageError(f"--{flag} must not be empty")
    name = args.name or environ.get(ENV_NAME) or None
    if name is not None:
        options["name"] = name
    identity = args.identity or environ.get(ENV_IDENTITY) or None
    if identity is not None:
        options["identity"] = identity
    if args.ttl is not None:
        if kind != "etcd":
            raise UsageError(f"--ttl applies to etcd only, not to the {kind} backend")
        options["ttl"] = int(args.ttl) if float(args.ttl).is_integer() else args.ttl  # etcd wants whole seconds
    if getattr(args, "lease", None) is not None:
        if kind not in ("mysql", "postgres"):
            raise UsageError(f"--lease applies to the SQL backends only, not to the {kind} backend (etcd: --ttl)")
        options["lease"] = int(args.lease) if float(args.lease).is_integer() else args.lease
    if args.poll_interval is not None:
        options["poll_interval"] = args.poll_interval
    if getattr(args, "command", None) == "run":
        # CMD is the leader's work: after a loss the lock is released only once CMD is stopped.
        options["stop_timeout"] = max(args.grace or 0.0, _DEFAULT_GRACE) + 2 * _KILL_WAIT + 1
    for flag in ("etcd_user", "etcd_ca", "etcd_cert", "etcd_key"):
        if getattr(args, flag) is not None and kind != "etcd":
            raise UsageError(f"--{flag.replace('_', '-')} applies to etcd only, not to the {kind} backend")
    etcd_user = args.etcd_user or environ.get(ENV_ETCD_USER) or None

    for variable in (ENV_MYSQL, ENV_POSTGRES):  # scrubbed even when another backend is chosen
        _secrets.add(_dsn_password(environ.get(variable, "")))
    target: str | list[str]
    if kind == "etcd":
        endpoints = [e.strip() for e in value.split(",") if e.strip()]
        if not endpoints:
            raise UsageError("--etcd needs at least one endpoint host:port")
        target, where = endpoints, ",".join(endpoints)
        # A supervisor must never fall back to "always leader": every instance would run CMD.
        options["degrade_to_local"] = False
        if etcd_user is not None:
            options["username"] = etcd_user
        if password is not None:
            if etcd_user is None:
                raise UsageError(f"a password for etcd needs --etcd-user (or {ENV_ETCD_USER})")
            options["password"] = password
        for flag, variable, option in (
            ("etcd_ca", ENV_ETCD_CA, "ca_file"),
            ("etcd_cert", ENV_ETCD_CERT, "cert_file"),
            ("etcd_key", ENV_ETCD_KEY, "key_file"),
        ):
            path = getattr(args, flag) or environ.get(variable) or None
            if path is not None:
                options[option] = path
    elif kind in ("mysql", "postgres"):
        _secrets.add(_dsn_password(value))
        where = redact_dsn(value)
        from ._config import parse_dsn

        try:
            database = parse_dsn(value, *(("mysql", "mariadb") if kind == "mysql" else ("postgresql", "postgres")))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        target = _with_password(value, password) if password is not None else value
        # Fencing gives CMD a token, and records full identities (MySQL names no holder without it).
        if not args.no_fencing and (database.database or kind == "postgres"):
            options["fencing"] = True
    else:
        target, where = value, value
    return Config(kind, target, where, options)


# --- argument parsing ----------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, with its own error messages (which quote the arguments, DSNs included) shown redacted."""

    def error(self, message: str) -> NoReturn:
        super().error(_shown(message))


_N = TypeVar("_N", int, float)


def _number(convert: Callable[[str], _N], accept: Callable[[_N], bool], wanted: str) -> Callable[[str], _N]:
    """An argparse type that converts the text and refuses values ``accept`` rejects (``wanted`` says which)."""

    def parse(text: str) -> _N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, not {text!r}")
        return value

    return parse


_positive = _number(float, lambda v: 0 < v < math.inf, "a finite number > 0")
_non_negative = _number(float, lambda v: 0 <= v < math.inf, "a finite number >= 0")
_port = _number(int, lambda v: 1 <= v <= 65535, "a port, 1 to 65535")


def _backend_options() -> _Parser:
    common = _Parser(add_help=False)
    g = common.add_argument_group("backend options")
    g.add_argument(
        "--etcd",
        metavar="ENDPOINTS",
        help=f"comma-separated etcd endpoints (host:port, https://host:port) [{ENV_ETCD}]",
    )
    g.add_argument("--mysql", metavar="DSN", help=f"mysql://user@host:port/database [{ENV_MYSQL}]")
    g.add_argument("--postgres", metavar="DSN", help=f"postgresql://user@host:port/database [{ENV_POSTGRES}]")
    g.add_argument("--file", metavar="PATH", help=f"lock file shared by the candidates on one machine [{ENV_FILE}]")
    g.add_argument(
        "--name", help=f"election name: lock name or etcd key prefix; required with a server backend [{ENV_NAME}]"
    )
    g.add_argument("--identity", help=f"this candidate's identity, shown by `leader` [{ENV_IDENTITY}]")
    g.add_argument("--ttl", type=_positive, metavar="SECONDS", help="etcd lease TTL (default 5)")
    g.add_argument(
        "--lease",
        type=_positive,
        metavar="SECONDS",
        help="SQL backends: how long the server keeps the lock of a leader it no longer hears from (default 10)",
    )
    g.add_argument(
        "--poll-interval", type=_positive, metavar="SECONDS", help="how often followers and `observe` poll (SQL)"
    )
    g.add_argument(
        "--password-file",
        metavar="PATH",
        help=f"read the password from PATH (first line) instead of {ENV_PASSWORD}; it replaces a DSN's password",
    )
    g.add_argument("--etcd-user", metavar="USER", help=f"etcd user name [{ENV_ETCD_USER}]")
    g.add_argument(
        "--etcd-ca", metavar="PATH", help=f"etcd over TLS: CA (PEM) to verify the server with [{ENV_ETCD_CA}]"
    )
    g.add_argument(
        "--etcd-cert",
        metavar="PATH",
        help=f"etcd over TLS: client certificate (PEM) for --client-cert-auth [{ENV_ETCD_CERT}]",
    )
    g.add_argument("--etcd-key", metavar="PATH", help=f"etcd over TLS: the client certificate's key [{ENV_ETCD_KEY}]")
    g.add_argument(
        "--no-fencing",
        action="store_true",
        help="SQL backends: do not keep tokens and identities in table aioelect_leaders "
        "(MySQL's `leader` then shows a connection, not an identity)",
    )
    g.add_argument(
        "--timeout",
        type=_positive,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the server at start before exiting with status 3 (default 10)",
    )
    out = common.add_argument_group("output")
    out.add_argument("-v", "--verbose", action="store_true", help="also log the library's informational messages")
    out.add_argument("-q", "--quiet", action="store_true", help="print only warnings and errors on stderr")
    return common


def build_parser() -> argparse.ArgumentParser:
    """The ``aioelect`` argument parser (``run``, ``leader``, ``observe``)."""
    common = _backend_options()
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="aioelect",
        description="Leader election from the shell: run a command only while leader, show or watch the leader.",
        epilog=_EPILOG,
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser(
        "run",
        parents=[common],
        help="run CMD only while leader",
        usage="aioelect run [options] -- CMD [ARGS...]",
        description=_RUN_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=fmt,
    )
    run.add_argument(
        "--grace",
        type=_non_negative,
        metavar="SECONDS",
        help="how long CMD's process group has between SIGTERM and SIGKILL after a loss; at most the "
        f"backend's safety margin less {_KILL_RESERVE:g}s (default: half the margin; "
        f"{_DEFAULT_GRACE:g} on the file backend)",
    )
    run.add_argument(
        "--pass-secret",
        action="append",
        default=[],
        metavar="NAME",
        help=f"hand secret variable NAME ({', '.join(SECRET_ENV)}) to CMD, which never gets them otherwise; "
        "repeatable; logged as a warning",
    )
    run.add_argument("--forever", action="store_true", help="campaign again after CMD exits or is stopped")
    run.add_argument(
        "--restart-delay",
        type=_non_negative,
        default=1.0,
        metavar="SECONDS",
        help="with --forever: pause before campaigning again, so others get a turn (default 1)",
    )
    metrics = run.add_argument_group("metrics")
    metrics.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (needs aioelect[prometheus])",
    )
    metrics.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the metrics listen on (default 127.0.0.1: this machine only)",
    )
    leader = sub.add_parser(
        "leader",
        parents=[common],
        help="print the current leader's identity (exit 1 if none)",
        description="Print the current leader's identity; exit 1 (printing nothing on stdout) if there is none.",
        epilog=_EPILOG,
        formatter_class=fmt,
    )
    leader.add_argument("--json", action="store_true", help='print {"leader": IDENTITY-or-null}')
    observe = sub.add_parser(
        "observe",
        parents=[common],
        help="print one line per leadership change until interrupted",
        description=(
            "Print the leader now and one line at each change, until SIGINT/SIGTERM (exit 0). "
            "SQL backends are polled every --poll-interval; etcd is watched."
        ),
        epilog=_EPILOG,
        formatter_class=fmt,
    )
    observe.add_argument("--json", action="store_true", help='print JSON lines {"time", "leader", ...}')
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("aioelect")
    except Exception:  # not installed as a distribution
        return "unknown"


def _setup_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ScrubbingFormatter("aioelect: %(message)s"))
    root = logging.getLogger("aioelect")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(logging.INFO if args.verbose else logging.WARNING)
    log.setLevel(logging.WARNING if args.quiet else logging.INFO)


# --- run ---------------------------------------------------------------------------------


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return cast(Callable[..., int], ctypes.CDLL(None, use_errno=True).prctl)
    except (OSError, AttributeError):
        return None


# Resolved here, in the parent: the forked child only calls it.
_prctl = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _withheld(variable: str) -> bool:
    """Whether ``variable`` is one of aioelect's secrets, kept out of CMD's environment."""
    return variable in SECRET_ENV or (
        variable.startswith("AIOELECT_") and ("PASSWORD" in variable or variable.endswith("_DSN"))
    )


def _safety_margin(elector: Elector) -> tuple[float, float, float] | None:
    """``(margin, lease, renew_deadline)``: how long before a cut-off leader's lock can pass on it knows of
    its loss; None for a backend whose leadership cannot be taken away while this process lives."""
    backend = elector._backend
    deadline = backend.renew_deadline
    lease = getattr(backend, "lease", None) or getattr(backend, "ttl", None)
    if deadline is None or not isinstance(lease, (int, float)):
        return None
    return float(lease) - deadline, float(lease), deadline


def _choose_grace(given: float | None, elector: Elector, kind: str) -> float:
    """The grace CMD gets after a loss: ``given`` if it fits in the safety margin (else UsageError)."""
    found = _safety_margin(elector)
    if found is None:
        return _DEFAULT_GRACE if given is None else given
    margin, lease, deadline = found
    limit = max(0.0, margin - _KILL_RESERVE)
    if given is not None and given > limit:
        longer = "--ttl" if kind == "etcd" else "--lease"
        raise UsageError(
            f"--grace {given:g} is too long for the {kind} backend: CMD must be dead before the lock can pass to "
            f"another candidate, and a cut-off leader learns of its loss only {margin:.3g}s before that (the "
            f"safety margin: lease {lease:g}s less renew deadline {deadline:.3g}s), {_KILL_RESERVE:g}s of which "
            f"are kept for SIGKILL; give --grace {limit:.3g} or less, or a longer {longer}"
        )
    if limit == 0:
        log.warning(
            "the %s backend's safety margin (%.3gs) leaves no time for SIGTERM: after a loss CMD gets SIGKILL at "
            "once, and may still run briefly after the lock can pass on; use a longer %s",
            kind,
            margin,
            "--ttl" if kind == "etcd" else "--lease",
        )
    return min(margin / 2, limit) if given is None else given


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a live (not zombie) member."""
    if sys.platform.startswith("linux"):
        try:
            entries = os.listdir("/proc")
        except OSError:
            entries = []
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != b"Z" and int(fields[2]) == pgid:
                return True
        if entries:
            return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _child_setup() -> None:  # pragma: no cover - runs in the forked child
    os.setpgid(0, 0)
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with aioelect, even on its SIGKILL


class _Runner:
    """``aioelect run``: one leadership (or one after another) and CMD under it."""

    def __init__(self, elector: Elector, cmd: Sequence[str], args: argparse.Namespace) -> None:
        self.elector = elector
        self.cmd = list(cmd)
        self.grace: float = args.grace if args.grace is not None else _DEFAULT_GRACE
        self.pass_secrets: list[str] = list(args.pass_secret)
        self.forever: bool = args.forever
        self.restart_delay: float = args.restart_delay
        self.child: asyncio.subprocess.Process | None = None
        self.signals: list[int] = []
        self.stopping = asyncio.Event()
        self._campaign_scope: anyio.CancelScope | None = None

    def on_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.stopping.set()
        if self._campaign_scope is not None:
            self._campaign_scope.cancel()
        if self.child is not None and self.child.returncode is None:
            log.info("forwarding %s to CMD (pid %d)", signal.Signals(sig).name, self.child.pid)
            self._signal_group(sig)

    def _signal_group(self, sig: int) -> None:
        """Send ``sig`` to CMD's process group: CMD and every process it started that stayed in it."""
        assert self.child is not None
        try:
            os.killpg(self.child.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:  # the group is gone and its id reused: signal the child alone
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.pid, sig)

    def _stopped_status(self) -> int:
        return 128 + self.signals[0]

    async def main(self) -> int:
        while True:
            lead = await self._campaign()
            if lead is None:
                log.info("stopped while campaigning")
                return self._stopped_status()
            try:
                status = await self._lead(lead)
            finally:
                await lead.release()
            if status is None:  # lost before CMD could start: it never ran, so campaign again
                continue
            if not self.forever or self.stopping.is_set():
                return status
            log.info("CMD ended with status %d; campaigning again in %gs", status, self.restart_delay)
            with anyio.move_on_after(self.restart_delay):
                await self.stopping.wait()
            if self.stopping.is_set():
                return status

    async def _campaign(self) -> Leadership | None:
        """Acquire in this task (leadership is bound to it); None if stopped first."""
        if self.stopping.is_set():
            return None
        log.info("campaigning as %s", self.elector.identity)
        with anyio.CancelScope() as scope:
            self._campaign_scope = scope
            try:
                lead = await self.elector.acquire()
            finally:
                self._campaign_scope = None
        if scope.cancelled_caught:
            return None
        return lead

    async def _lead(self, lead: Leadership) -> int | None:
        """Run CMD under ``lead``; return its exit status, or None if it could not start as leader."""
        if self.stopping.is_set():
            return self._stopped_status()
        # aioelect's secrets stay with aioelect unless handed over by name.
        env = {k: v for k, v in os.environ.items() if not _withheld(k) or k in self.pass_secrets}
        env[ENV_IDENTITY] = lead.identity
        env[ENV_TOKEN] = "" if lead.token is None else str(lead.token)
        for key in _ADDED_ENV:  # our own settings, not the user's
            env.pop(key, None)
        if not lead.held:  # nothing may start once leadership may have passed on
            log.warning("leadership lost before CMD started (%s)", lead.lost_reason)
            return None
        try:
            self.child = await asyncio.create_subprocess_exec(*self.cmd, env=env, preexec_fn=_child_setup)
        except FileNotFoundError:
            log.error("CMD not found: %s", self.cmd[0])
            return EXIT_NOT_FOUND
        except OSError as exc:  # permission denied, exec format error...
            log.error("CMD cannot be executed: %s (%s)", self.cmd[0], exc.strerror)
            return EXIT_NOT_EXECUTABLE
        child = self.child
        log.info("leader (token %s): started %s, pid %d", lead.token, os.path.basename(self.cmd[0]), child.pid)
        if self.signals:  # arrived while CMD was being started
            self._signal_group(self.signals[-1])
        exited = asyncio.ensure_future(child.wait())
        lost = asyncio.ensure_future(lead.wait_lost())
        # CMD is the leader's work: on a loss the keeper cancels this scope, then releases the
        # lock only once CMD's whole process group is gone (the finally below).
        with lead._guard():
            try:
                await asyncio.wait({exited, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                with anyio.CancelScope(shield=True):
                    await self._stop_group(lead, exited)
        status = _exit_status(await exited) if exited.done() and not exited.cancelled() else 128 + signal.SIGKILL
        log.info("CMD exited with status %d", status)
        return status

    async def _stop_group(self, lead: Leadership, exited: asyncio.Future[int]) -> None:
        """Leave nothing of CMD's process group running; called before every release."""
        assert self.child is not None
        pgid = self.child.pid
        if not exited.done():
            if not lead.lost:  # cancelled ourselves: never leave CMD running
                self._signal_group(signal.SIGKILL)
                await self._group_gone(pgid, exited, _KILL_WAIT)
                return
            log.warning("leadership lost (%s): stopping CMD (pid %d) and its process group", lead.lost_reason, pgid)
        elif _group_alive(pgid):
            log.warning(
                "processes still running in CMD's process group %d after CMD exited: stopping them before the "
                "leadership is released",
                pgid,
            )
        else:
            return
        self._signal_group(signal.SIGTERM)
        if await self._group_gone(pgid, exited, self.grace):
            return
        log.warning("CMD's process group still running %gs after SIGTERM: sending SIGKILL", self.grace)
        self._signal_group(signal.SIGKILL)
        if not await self._group_gone(pgid, exited, _KILL_WAIT):
            log.error("CMD's process group %d survived SIGKILL for %gs", pgid, _KILL_WAIT)

    @staticmethod
    async def _group_gone(pgid: int, exited: asyncio.Future[int], timeout: float) -> bool:  # noqa: ASYNC109
        """Wait up to ``timeout`` for CMD to exit and its process group to empty; True if both did."""
        with anyio.move_on_after(timeout):
            await asyncio.shield(exited)
            while _group_alive(pgid):  # noqa: ASYNC110 - nothing signals a group emptying: poll /proc
                await anyio.sleep(0.02)
            return True
        return False


# --- leader and observe ------------------------------------------------------------------


async def _probe(elector: Elector, config: Config, timeout: float) -> str | None:  # noqa: ASYNC109
    """Ask who leads, bounded: the first contact with the server."""
    try:
        with anyio.fail_after(timeout):
            return await elector.leader()
    except TimeoutError:
        raise BackendError(f"{config.kind} at {config.where} did not answer within {timeout:g}s") from None
    except BackendUnavailable as exc:
        raise BackendError(str(exc)) from None
    except OSError as exc:
        raise BackendError(f"{config.kind} at {config.where} is unreachable: {exc}") from None
    except ElectionError as exc:
        raise BackendError(str(exc)) from None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _out(line: str) -> None:
    """One line of data on stdout (identities are not secrets), non-printables escaped, flushed at once."""
    sys.stdout.write(_escape(line) + "\n")
    sys.stdout.flush()


def _json(value: object) -> str:
    """``value`` as one line of JSON in printable ASCII (DEL, which JSON allows raw, escaped too)."""
    return json.dumps(value).replace("\x7f", "\\u007f")


def _err(line: str) -> None:
    """One message on stderr: DSNs redacted, secrets scrubbed, non-printables escaped."""
    sys.stderr.write(_shown(line) + "\n")
    sys.stderr.flush()


async def _leader(elector: Elector, config: Config, args: argparse.Namespace) -> int:
    who = await _probe(elector, config, args.timeout)
    if args.json:
        _out(_json({"leader": who}))
    elif who is not None:
        _out(who)
    else:
        log.info("no leader")
    return 0 if who is not None else EXIT_NO_LEADER


async def _observe(elector: Elector, config: Config, args: argparse.Namespace) -> int:
    def emit(who: str | None) -> None:
        if args.json:
            _out(_json({"time": _now(), "leader": who, "backend": config.kind, "name": elector.name}))
        else:
            _out(f"{_now()}  " + (f"leader {who}" if who is not None else "no leader"))

    await _probe(elector, config, args.timeout)  # fail fast (status 3) on a server that cannot be reached
    last: object = object()
    started = False
    backoff = Backoff(first=0.5, maximum=5.0)
    while True:
        changes = cast(AsyncGenerator[Any, None], elector.observe())
        try:
            if not started:
                try:
                    with anyio.fail_after(args.timeout):
                        who = await changes.__anext__()
                except TimeoutError:
                    raise BackendError(
                        f"{config.kind} at {config.where} did not answer within {args.timeout:g}s"
                    ) from None
                started = True
                last = who
                emit(who)
            async for who in changes:
                backoff.reset()
                if who != last:
                    last = who
                    emit(who)
            return 0
        except (BackendUnavailable, OSError) as exc:
            if not started:
                detail = str(exc) if isinstance(exc, BackendUnavailable) else f"unreachable: {exc}"
                raise BackendError(f"{config.kind} at {config.where}: {detail}") from None
            delay = backoff.next_delay()
            log.warning("lost contact with %s (%s); retrying in %.1fs", config.kind, exc, delay)
            await anyio.sleep(delay)
        except ElectionError as exc:
            raise BackendError(str(exc)) from None
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await changes.aclose()


# --- entry point -------------------------------------------------------------------------


def _check_metrics(args: argparse.Namespace) -> None:
    """Fail before campaigning if --metrics-port cannot work (the extra is missing)."""
    if getattr(args, "metrics_port", None) is None:
        return
    try:
        import aioelect.metrics  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"--metrics-port: {exc}") from None


def _serve_metrics(elector: Elector, host: str, port: int) -> None:
    """Expose ``elector``'s metrics on ``host:port`` (a daemon thread that ends with the process)."""
    import prometheus_client

    from .metrics import PrometheusMetrics

    # A registry of our own (main() may run more than once in a process), with the usual process metrics.
    registry = prometheus_client.CollectorRegistry()
    for collector in (prometheus_client.ProcessCollector, prometheus_client.PlatformCollector):
        collector(registry=registry)
    prometheus_client.GCCollector(registry=registry)
    metrics = PrometheusMetrics(registry)
    metrics.attach(elector)
    try:
        metrics.serve(port, host=host)
    except OSError as exc:
        raise UsageError(f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    log.info("metrics on http://%s:%d/metrics", host if ":" not in host else f"[{host}]", port)


async def _amain(command: str, config: Config, args: argparse.Namespace, cmd: Sequence[str]) -> int:
    elector = config.build()
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    runner = _Runner(elector, cmd, args) if command == "run" else None
    interrupted: list[int] = []

    def on_signal(sig: int) -> None:
        if runner is not None:
            runner.on_signal(sig)
        elif not interrupted:
            interrupted.append(sig)
            main_task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        if runner is not None:
            runner.grace = _choose_grace(args.grace, elector, config.kind)
            log.debug("--grace %gs", runner.grace)
        if runner is not None and args.metrics_port is not None:
            _serve_metrics(elector, args.metrics_host, args.metrics_port)
        if runner is not None:
            # Fail fast on a server that cannot be reached at all; later outages are retried.
            probe = config.build()
            try:
                await _probe(probe, config, args.timeout)
            finally:
                with anyio.CancelScope(shield=True):
                    await probe.aclose()
            return await runner.main()
        if command == "leader":
            return await _leader(elector, config, args)
        return await _observe(elector, config, args)
    except asyncio.CancelledError:
        if not interrupted:
            raise
        # Interrupted: observe ends normally, leader as a death by that signal would.
        return 0 if command == "observe" else 128 + interrupted[0]
    except ElectionError as exc:  # permanent: wrong password, unknown database...
        raise BackendError(str(exc)) from None
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            await elector.aclose()


def _usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.error(message)  # shown redacted by _Parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the ``aioelect`` command and return its exit status (see ``aioelect --help``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    cmd: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, cmd = argv[:split], argv[split + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    subparser = _subparser(parser, args.command)
    if args.command == "run" and not cmd:
        _usage_error(subparser, "run needs a command after --, e.g. aioelect run --mysql DSN -- ./job.sh")
    if args.command == "run" and shutil.which(cmd[0]) is None:
        # Found out before campaigning, so a typo never takes leadership from a working instance.
        _err(f"aioelect: error: CMD not found or not executable: {cmd[0]}")
        return EXIT_NOT_FOUND if not os.path.exists(cmd[0]) else EXIT_NOT_EXECUTABLE
    if args.command != "run" and cmd:
        _usage_error(subparser, f"{args.command} takes no command after --")
    if args.verbose and args.quiet:
        _usage_error(subparser, "give only one of --verbose and --quiet")
    for variable in getattr(args, "pass_secret", []):
        if not _withheld(variable):
            _usage_error(subparser, f"--pass-secret {variable}: not a secret variable, CMD gets it anyway")
    _setup_logging(args)
    for variable in getattr(args, "pass_secret", []):
        log.warning("--pass-secret: CMD gets %s, one of aioelect's secrets, in its environment", variable)
    if "GRPC_ENABLE_FORK_SUPPORT" not in os.environ:
        # CMD is exec'd right after fork: gRPC's (etcd's) fork handlers only add noise on stderr.
        os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
        _ADDED_ENV.append("GRPC_ENABLE_FORK_SUPPORT")
    if "GRPC_VERBOSITY" not in os.environ:
        # gRPC's C core would print its own lines next to our clear error (e.g. a refused certificate).
        os.environ["GRPC_VERBOSITY"] = "NONE"
        _ADDED_ENV.append("GRPC_VERBOSITY")
    try:
        config = configure(args, env)
        _check_metrics(args)
        return asyncio.run(_amain(args.command, config, args, cmd))
    except UsageError as exc:
        _usage_error(subparser, str(exc))
    except BackendError as exc:
        _err(f"aioelect: error: {exc}")
        return EXIT_BACKEND
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 128 + signal.SIGINT


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            choice = action.choices.get(command)
            if isinstance(choice, argparse.ArgumentParser):
                return choice
    return parser
