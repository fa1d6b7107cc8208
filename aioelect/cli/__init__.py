"""The ``aioelect`` command (also ``python -m aioelect``).

* ``aioelect run [options] -- CMD [ARGS...]`` campaigns and runs CMD only
  while this process leads; see :func:`main` and ``aioelect run --help``.
* ``aioelect leader`` prints the current leader's identity (exit 1: none).
* ``aioelect observe`` prints one line per leadership change until interrupted.
* ``aioelect shards --names A,B,C [options] -- CMD [ARGS...]`` spreads the
  names over the instances that run it and runs one CMD per name owned here.

Passwords come only from ``AIOELECT_PASSWORD`` or ``--password-file`` (or
inside a DSN); they are never printed: every message this command writes is
scrubbed of them, and every DSN it shows is redacted by text. Text that came
from a server (identities, error messages) is printed with its control and
other non-printable characters escaped.

The package, one job per module: ``_args`` (options and help),
``_configure`` (options laid over :class:`aioelect.wiring._settings.Settings`),
``_commands`` (``leader``, ``observe``), ``_run`` (``run``), ``_shards`` (``shards``),
``_supervisor`` (CMD's process group), ``_output`` (what is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from ..wiring._settings import Settings, is_secret
from ._args import build_parser, split_command
from ._commands import execute
from ._configure import configure
from ._output import err, setup_logging
from ._run import check_metrics
from ._status import (
    EXIT_BACKEND,
    EXIT_NO_LEADER,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    BackendError,
    UsageError,
)

__all__ = ["EXIT_BACKEND", "EXIT_NO_LEADER", "EXIT_USAGE", "main"]

log = logging.getLogger("aioelect.cli")

#: gRPC settings this command needs in its own process, unless the user set them.
_GRPC_SETTINGS = (
    # CMD is exec'd right after fork: gRPC's (etcd's) fork handlers only add noise on stderr.
    ("GRPC_ENABLE_FORK_SUPPORT", "false"),
    # gRPC's C core would print its own lines next to our clear error (e.g. a refused certificate).
    ("GRPC_VERBOSITY", "NONE"),
)
#: The variables :func:`_configure_grpc` set, kept out of CMD's environment: they are ours, not the user's.
_SET_FOR_GRPC: set[str] = set()


def _configure_grpc() -> None:
    """Put :data:`_GRPC_SETTINGS` in this process's environment, where the user has not set them.

    The one place this command writes to ``os.environ``: gRPC reads both
    settings only from the process environment (its C core, when first
    initialised) and offers no API for either. Called before any backend
    is built, so before grpc is imported.
    """
    for variable, value in _GRPC_SETTINGS:
        if variable not in os.environ:
            os.environ[variable] = value
            _SET_FOR_GRPC.add(variable)


def _usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.error(message)  # shown redacted by the parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the ``aioelect`` command and return its exit status (see ``aioelect --help``).

    ``environ`` (default ``os.environ``) is where the settings are read;
    CMD's environment is made from ``os.environ``.
    """
    argv, cmd = split_command(list(sys.argv[1:] if argv is None else argv))
    env = os.environ if environ is None else environ
    parsers = build_parser()
    args = parsers.main.parse_args(argv)
    subparser = parsers.of(args.command)
    if args.command == "run" and not cmd:
        _usage_error(subparser, "run needs a command after --, e.g. aioelect run --mysql DSN -- ./job.sh")
    if args.command == "shards" and not cmd:
        _usage_error(subparser, "shards needs a command after --, e.g. aioelect shards --names a,b -- ./worker.sh")
    if args.command in ("run", "shards") and shutil.which(cmd[0]) is None:
        # Found out before campaigning, so a typo never takes leadership from a working instance.
        err(f"aioelect: error: CMD not found or not executable: {cmd[0]}")
        return EXIT_NOT_FOUND if not os.path.exists(cmd[0]) else EXIT_NOT_EXECUTABLE
    if args.command not in ("run", "shards") and cmd:
        _usage_error(subparser, f"{args.command} takes no command after --")
    if args.verbose and args.quiet:
        _usage_error(subparser, "give only one of --verbose and --quiet")
    for variable in getattr(args, "pass_secret", []):
        if not is_secret(variable):
            _usage_error(subparser, f"--pass-secret {variable}: not a secret variable, CMD gets it anyway")
    setup_logging(args)
    for variable in getattr(args, "pass_secret", []):
        log.warning("--pass-secret: CMD gets %s, one of aioelect's secrets, in its environment", variable)
    _configure_grpc()
    cmd_environ = {k: v for k, v in os.environ.items() if k not in _SET_FOR_GRPC}
    try:
        try:
            settings = Settings.from_environ(env)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        config = configure(args, settings)
        check_metrics(args)
        return asyncio.run(execute(args.command, config, args, cmd, cmd_environ))
    except UsageError as exc:
        _usage_error(subparser, str(exc))
    except BackendError as exc:
        err(f"aioelect: error: {exc}")
        return EXIT_BACKEND
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 128 + signal.SIGINT
