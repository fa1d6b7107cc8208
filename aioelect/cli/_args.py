"""The ``aioelect`` command line: its options and argparse's errors shown redacted (the help texts are in ``_help``).

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

from ..wiring._settings import (
    ENV_ALLOW_UNSAFE_TOPOLOGY,
    ENV_ALLOW_VOLATILE_TOKENS,
    ENV_CHECK_INTERVAL,
    ENV_CHECK_TIMEOUT,
    ENV_CONNECT_TIMEOUT,
    ENV_ETCD_CA,
    ENV_ETCD_CERT,
    ENV_ETCD_ENDPOINTS,
    ENV_ETCD_KEY,
    ENV_ETCD_USER,
    ENV_FENCING,
    ENV_FILE,
    ENV_FILE_MODE,
    ENV_IDENTITY,
    ENV_KEY_PREFIX,
    ENV_LEASE,
    ENV_MIN_REPLICAS,
    ENV_MYSQL_DSN,
    ENV_NAME,
    ENV_PASSWORD,
    ENV_POSTGRES_DSN,
    ENV_REDIS_URL,
    ENV_RENEW_DEADLINE,
    ENV_SCHEMA,
    SECRET_VARIABLES,
)
from ._args_handover import add_handover_options, add_health_options, add_step_down
from ._help import EPILOG, RUN_DESCRIPTION, SHARDS_DESCRIPTION
from ._output import shown
from ._supervisor import DEFAULT_GRACE, KILL_RESERVE

__all__ = ["Parsers", "build_parser", "split_command"]


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
    g.add_argument(
        "--redis",
        metavar="URL",
        help=f"redis://user@host:port/db, rediss://..., redis+sentinel://..., redis+cluster://... [{ENV_REDIS_URL}]",
    )
    g.add_argument("--file", metavar="PATH", help=f"lock file shared by the candidates on one machine [{ENV_FILE}]")
    g.add_argument(
        "--name", help=f"election name: lock name or etcd key prefix; required with a server backend [{ENV_NAME}]"
    )
    g.add_argument("--identity", help=f"this candidate's identity, shown by `leader` [{ENV_IDENTITY}]")
    g.add_argument(
        "--ttl", type=_positive, metavar="SECONDS", help=f"etcd lease TTL, whole seconds (default 5) [{ENV_LEASE}]"
    )
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
        ("--check-timeout", f"how long one confirmation may take before it counts as failed [{ENV_CHECK_TIMEOUT}]"),
        ("--connect-timeout", f"how long connecting to the server may take (default 5) [{ENV_CONNECT_TIMEOUT}]"),
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
        f"(MySQL's `leader` then shows a connection, not an identity) [{ENV_FENCING}=0]",
    )
    g.add_argument(
        "--schema",
        metavar="SCHEMA",
        help=f"PostgreSQL: schema of table aioelect_leaders, which records full identities [{ENV_SCHEMA}]",
    )
    g.add_argument(
        "--min-replicas",
        type=_number(int, lambda n: 0 <= n <= 100, "a whole number from 0 to 100"),
        metavar="N",
        help=f"Redis: grant only once WAIT says N replicas have the lock and the token (default 0) "
        f"[{ENV_MIN_REPLICAS}]",
    )
    g.add_argument(
        "--key-prefix",
        metavar="PREFIX",
        help=f"Redis: prefix of every key and channel (default aioelect:) [{ENV_KEY_PREFIX}]",
    )
    g.add_argument(
        "--file-mode",
        metavar="MODE",
        help=f"file: the lock files' mode, 600 (the owner only, default) or 660 (the file's group too) "
        f"[{ENV_FILE_MODE}]",
    )
    weakening = common.add_argument_group("options that give up a guarantee (each logged at WARNING)")
    weakening.add_argument(
        "--allow-volatile-tokens",
        action="store_true",
        default=None,
        help="MySQL, Redis: accept a server on which a crash can lose the last fencing token, so that a later "
        "leader may get a token already handed out (Redis without appendonly yes + appendfsync always; MySQL "
        f"without innodb_flush_log_at_trx_commit=1) [{ENV_ALLOW_VOLATILE_TOKENS}]",
    )
    weakening.add_argument(
        "--allow-unsafe-topology",
        action="store_true",
        default=None,
        help="MySQL: accept Galera or Group Replication, where GET_LOCK is per node, so two leaders can run at "
        f"once [{ENV_ALLOW_UNSAFE_TOPOLOGY}]",
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
        epilog=EPILOG,
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser(
        "run",
        parents=[common],
        help="run CMD only while leader",
        usage="aioelect run [options] -- CMD [ARGS...]",
        description=RUN_DESCRIPTION,
        epilog=EPILOG,
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
    add_handover_options(run, _positive, _number)
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
        description=SHARDS_DESCRIPTION,
        epilog=EPILOG,
        formatter_class=fmt,
    )
    shards.add_argument(
        "--names",
        required=True,
        metavar="NAMES",
        help="the shards: comma-separated names, or a count N for the names 0 to N-1 (at most 100000)",
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
    add_health_options(shards, _positive, _number, shards=True)
    leader = sub.add_parser(
        "leader",
        parents=[common],
        help="print the current leader's identity (exit 1 if none)",
        description="Print the current leader's identity; exit 1 (printing nothing on stdout) if there is none.",
        epilog=EPILOG,
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
        epilog=EPILOG,
        formatter_class=fmt,
    )
    observe.add_argument("--json", action="store_true", help='print JSON lines {"time", "leader", ...}')
    step_down = add_step_down(sub, common, EPILOG, fmt, _number)
    return Parsers(parser, {"run": run, "shards": shards, "leader": leader, "observe": observe, "step-down": step_down})


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("aioelect")
    except Exception:  # not installed as a distribution
        return "unknown"
