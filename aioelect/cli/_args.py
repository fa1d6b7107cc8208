"""The ``aioelect`` command line: its options, help texts and argparse's errors shown redacted.

Built on argparse's public API only. :func:`build_parser` returns the
parser together with each command's own parser, so that a usage error is
reported with the usage of the command it concerns.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from .._settings import (
    ENV_CHECK_INTERVAL,
    ENV_ETCD_CA,
    ENV_ETCD_CERT,
    ENV_ETCD_ENDPOINTS,
    ENV_ETCD_KEY,
    ENV_ETCD_USER,
    ENV_FILE,
    ENV_IDENTITY,
    ENV_LEASE,
    ENV_MYSQL_DSN,
    ENV_NAME,
    ENV_PASSWORD,
    ENV_POLL_INTERVAL,
    ENV_POSTGRES_DSN,
    ENV_REDIS_URL,
    ENV_RENEW_DEADLINE,
    ENV_SHARD,
    ENV_TOKEN,
    SECRET_VARIABLES,
)
from ._output import shown
from ._supervisor import DEFAULT_GRACE, KILL_RESERVE

__all__ = ["Parsers", "build_parser", "split_command"]

_EPILOG = f"""\
backend selection:
  Give one of --etcd, --mysql, --postgres, --redis or --file. Without any,
  the environment is read like aioelect.from_env(): {ENV_ETCD_ENDPOINTS},
  {ENV_MYSQL_DSN}, {ENV_POSTGRES_DSN}, {ENV_REDIS_URL}, {ENV_FILE}, in that
  priority. A backend named on the command line replaces the environment's.

environment:
  {ENV_ETCD_ENDPOINTS:<24} comma-separated etcd endpoints (host:port or https://host:port)
  {ENV_MYSQL_DSN:<24} mysql://user@host:port/database
  {ENV_POSTGRES_DSN:<24} postgresql://user@host:port/database
  {ENV_REDIS_URL:<24} redis://user@host:port/db (rediss:// for TLS)
  {ENV_FILE:<24} path of a lock file (one machine only)
  {ENV_NAME:<24} election name (lock name / key prefix)
  {ENV_IDENTITY:<24} this candidate's identity (default hostname:pid:random)
  {ENV_PASSWORD:<24} password for the DSN's user or the etcd user; never printed
  {ENV_ETCD_USER:<24} etcd user name
  {ENV_ETCD_CA:<24} etcd: CA certificate (PEM) that verifies the server
  {ENV_ETCD_CERT:<24} etcd: client certificate (PEM), with {ENV_ETCD_KEY}
  {ENV_ETCD_KEY:<24} etcd: the client certificate's unencrypted key (PEM)
  {ENV_LEASE:<24} seconds a silent leader keeps the election (--lease, etcd --ttl)
  {ENV_RENEW_DEADLINE:<24} seconds a leader may go unconfirmed before it fences itself (--renew-deadline)
  {ENV_POLL_INTERVAL:<24} seconds between a follower's tries (--poll-interval)
  {ENV_CHECK_INTERVAL:<24} seconds between a leader's confirmations (--check-interval)
  (--renew-deadline, --check-interval, --check-timeout or a timing variable that
  means nothing to the chosen backend is logged at WARNING and ignored)

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

probes (run):
  --health-port PORT serves http://HOST:PORT/healthz (200 while aioelect
  runs), /readyz (200 while the backend answers) and /leader (200 only
  while this process leads), each a JSON object with role, identity,
  leader and token (HOST: --health-host, default 127.0.0.1).
  Both servers run in aioelect's event loop: at most 32 connections each
  (fewer under a low ulimit -n), the surplus reset; a request must arrive
  within 5 s; so they never hold more descriptors than that.

exit status:
  0    success (observe: interrupted by SIGINT/SIGTERM)
  1    leader: there is no leader
  2    bad usage or configuration
  3    backend unreachable, refused (wrong password, unknown database...),
       or its driver not installed
  run: CMD's exit status; 128+N when CMD died of signal N (143: SIGTERM,
       137: SIGKILL), or when aioelect was stopped by signal N before CMD
       started; 126/127 when CMD cannot be executed / is not found;
       75 with --no-wait when another instance leads (CMD did not run;
       --conflict-exit-code N chooses another status).
"""

_RUN_DESCRIPTION = f"""\
Campaign, and run CMD only while this process is the leader.

* SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to
  CMD (to its process group), SIGPIPE as SIGTERM; aioelect then exits with
  CMD's status (no restart with --forever). Before CMD starts they stop the
  campaign.
* CMD's tree: CMD and every process it starts, even one that calls setsid
  or double-forks (Linux: CMD runs under a small shim process, a child
  subreaper, that keeps them all its descendants).
* If leadership is lost, CMD's tree gets SIGTERM, then SIGKILL after
  --grace seconds, and the lock is released only once the tree is gone.
  --grace must end before the lock can pass to another candidate: at most
  the backend's safety margin (lease less renew deadline: 3s on MySQL,
  PostgreSQL and Redis with the default --lease, 1.67s on etcd with the
  default --ttl)
  less {KILL_RESERVE:g}s; by default half the margin.
* When CMD exits, processes of its tree still running are stopped the
  same way before the leadership is released.
* Without --forever, aioelect exits with CMD's status once CMD ends; with
  --forever it campaigns again (after --restart-delay) until interrupted.
  Long-running commands (aioelect run --forever -- celery beat) keep one
  instance running on some host: a follower waits and takes over.
* --no-wait tries once, like flock -n: when another instance leads, CMD
  does not run and aioelect exits with status 75 (--conflict-exit-code N,
  like flock -E, chooses another: 0 where 75 would count as a failure).
  Cron on several hosts then runs a job once per schedule, not once per
  host in turn.
* If aioelect itself dies otherwise (SIGKILL, the OOM killer, a crash),
  the shim SIGKILLs CMD's whole tree at once (measured on 2 busy cores:
  gone after 9 to 16 ms in the median, 84 ms at most) and holds the lock
  file or the server session until then: on the file, MySQL and PostgreSQL
  backends the lock passes on only once the tree is gone; on etcd the lease
  ends TTL seconds later. As PID 1 (in a container) aioelect reaps the
  orphans it is handed.
* Not covered: processes started through another service (systemd-run,
  at, ssh, a container runtime), a process stuck in the kernel (it dies
  when the kernel lets go; logged), a stopped (SIGSTOP) or frozen aioelect
  (the lease runs out; use the fencing token), and systems other than
  Linux (no shim: CMD runs in its process group, which setsid leaves, and
  outlives a SIGKILLed aioelect).
* CMD's environment gets {ENV_IDENTITY} (ours) and {ENV_TOKEN} (the
  fencing token of this leadership, empty if the backend has none). It does
  not get aioelect's secrets unless --pass-secret NAME: {ENV_PASSWORD},
  {ENV_MYSQL_DSN}, {ENV_POSTGRES_DSN}, {ENV_REDIS_URL}, any other
  AIOELECT_* variable whose name holds PASSWORD or ends in _DSN or _URL,
  and the database clients' variables: libpq's (PGPASSWORD, PGPASSFILE,
  PGHOST...) and those starting with MYSQL_, MARIADB_ or LIBMYSQL_
  (MYSQL_PWD...).
"""


_SHARDS_DESCRIPTION = f"""\
Spread --names over the instances that run this command (same --names,
same --name), and run one CMD per name this instance owns.

* Each instance owns a balanced share: with m instances, len(names) // m
  names or one more. A name moves only when an instance joins or leaves
  (or its leadership is lost); no name is owned by two instances at once.
* CMD's environment gets {ENV_SHARD} (the name), {ENV_TOKEN} (that name's
  fencing token) and {ENV_IDENTITY} (ours); not aioelect's secrets unless
  --pass-secret NAME (as for run).
* When a name moves or its leadership is lost, its CMD's tree gets SIGTERM,
  then SIGKILL after --grace seconds, and the name is let go only once the
  tree is gone (the process-tree guarantees of run, per CMD). --grace is
  bounded by the backend's safety margin as for run.
* A CMD that exits is started again after --restart-delay while its name
  is still owned.
* SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to
  every CMD (SIGPIPE as SIGTERM); each name is let go once its tree is
  gone, and aioelect exits with 128 + the signal.
* Needs a server backend (etcd, MySQL, PostgreSQL): every election of the
  instance is on one shared session (one etcd lease, one SQL connection),
  so its names are lost together when that session ends. --max-instances
  bounds how many instances take part.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with its own error messages (which quote the arguments, DSNs included) shown redacted."""

    def error(self, message: str) -> NoReturn:
        super().error(shown(message))


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
_exit_code = _number(int, lambda v: 0 <= v <= 255, "an exit status, 0 to 255")


def _backend_options() -> _Parser:
    common = _Parser(add_help=False)
    g = common.add_argument_group("backend options")
    g.add_argument(
        "--etcd",
        metavar="ENDPOINTS",
        help=f"comma-separated etcd endpoints (host:port, https://host:port) [{ENV_ETCD_ENDPOINTS}]",
    )
    g.add_argument("--mysql", metavar="DSN", help=f"mysql://user@host:port/database [{ENV_MYSQL_DSN}]")
    g.add_argument("--postgres", metavar="DSN", help=f"postgresql://user@host:port/database [{ENV_POSTGRES_DSN}]")
    g.add_argument("--redis", metavar="URL", help=f"redis://user@host:port/db or rediss://... [{ENV_REDIS_URL}]")
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
        help="SQL and Redis backends: how long the server keeps the lock of a leader it no longer hears from "
        "(default 10)",
    )
    g.add_argument(
        "--poll-interval", type=_positive, metavar="SECONDS", help="how often followers and `observe` poll (SQL)"
    )
    for flag, help_text in (
        ("--renew-deadline", f"how long a leader may go unconfirmed before it stops CMD and lets go; shorter than "
                             f"the lease [{ENV_RENEW_DEADLINE}]"),
        ("--check-interval", f"how often a leader confirms it still holds the lock [{ENV_CHECK_INTERVAL}]"),
        ("--check-timeout", "how long one confirmation may take before it counts as failed"),
    ):  # fmt: skip
        g.add_argument(flag, type=_positive, metavar="SECONDS", help=help_text)
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


@dataclass(frozen=True)
class Parsers:
    """The ``aioelect`` parser and each command's own parser."""

    main: argparse.ArgumentParser
    commands: dict[str, argparse.ArgumentParser]

    def of(self, command: str | None) -> argparse.ArgumentParser:
        """The parser of ``command`` (the main parser for an unknown one): its usage goes with an error."""
        return self.commands.get(command or "", self.main)


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` cut at the first ``--``: aioelect's arguments, and CMD with its arguments (empty without ``--``)."""
    if "--" not in argv:
        return argv, []
    split = argv.index("--")
    return argv[:split], argv[split + 1 :]


def build_parser() -> Parsers:
    """The ``aioelect`` argument parsers (``run``, ``shards``, ``leader``, ``observe``)."""
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
        help="how long CMD's tree has between SIGTERM and SIGKILL after a loss; at most the "
        f"backend's safety margin less {KILL_RESERVE:g}s (default: half the margin; "
        f"{DEFAULT_GRACE:g} on the file backend)",
    )
    run.add_argument(
        "--pass-secret",
        action="append",
        default=[],
        metavar="NAME",
        help=f"hand secret variable NAME ({', '.join(SECRET_VARIABLES)}, PGPASSWORD, MYSQL_PWD...) to CMD, which "
        "never gets them otherwise; "
        "repeatable; logged as a warning",
    )
    run.add_argument("--forever", action="store_true", help="campaign again after CMD exits or is stopped")
    run.add_argument(
        "--no-wait",
        action="store_true",
        help="try once: if another instance leads, do not run CMD and exit with status 75 (like flock -n)",
    )
    run.add_argument(
        "--conflict-exit-code",
        type=_exit_code,
        default=None,
        metavar="N",
        help="with --no-wait: the exit status when another instance leads, 0 to 255 (default 75; like flock -E); "
        "0 for a Kubernetes CronJob or a systemd unit that would count 75 as a failure",
    )
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
    probes = run.add_argument_group("probes (Kubernetes)")
    probes.add_argument(
        "--health-port",
        type=_port,
        metavar="PORT",
        help="serve GET /healthz (alive), /readyz (backend answers) and /leader (200 only while leading) "
        "on http://HOST:PORT, as JSON",
    )
    probes.add_argument(
        "--health-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the probes listen on (default 127.0.0.1; in a pod 0.0.0.0, for the kubelet)",
    )
    shards = sub.add_parser(
        "shards",
        parents=[common],
        help="run one CMD per shard (name) this instance owns",
        usage="aioelect shards --names NAME,NAME,... [options] -- CMD [ARGS...]",
        description=_SHARDS_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=fmt,
    )
    shards.add_argument(
        "--names",
        required=True,
        metavar="NAMES",
        help="the shards: comma-separated names, or a count N for the names 0 to N-1",
    )
    shards.add_argument(
        "--grace",
        type=_non_negative,
        metavar="SECONDS",
        help="how long a CMD's tree has between SIGTERM and SIGKILL when its name goes; at most the backend's "
        f"safety margin less {KILL_RESERVE:g}s (default: half the margin)",
    )
    shards.add_argument(
        "--pass-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="hand secret variable NAME to every CMD, which never gets them otherwise; repeatable; logged",
    )
    shards.add_argument(
        "--restart-delay",
        type=_non_negative,
        default=1.0,
        metavar="SECONDS",
        help="pause before a CMD that exited is started again, while its name is owned (default 1)",
    )
    shards.add_argument(
        "--max-instances",
        type=_number(int, lambda n: n >= 1, "a whole number >= 1"),
        default=16,
        metavar="N",
        help="how many instances can take part (default 16); one more owns nothing and logs a warning",
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
    return Parsers(parser, {"run": run, "shards": shards, "leader": leader, "observe": observe})


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("aioelect")
    except Exception:  # not installed as a distribution
        return "unknown"
