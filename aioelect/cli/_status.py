"""The ``aioelect`` command's exit statuses and the two errors that end it with one."""

from __future__ import annotations

__all__ = [
    "EXIT_BACKEND",
    "EXIT_NOT_EXECUTABLE",
    "EXIT_NOT_FOUND",
    "EXIT_NOT_LEADER",
    "EXIT_NOT_STEPPED_DOWN",
    "EXIT_NO_LEADER",
    "EXIT_USAGE",
    "BackendError",
    "UsageError",
]

#: ``leader``: nobody leads.
EXIT_NO_LEADER = 1
#: Bad options or configuration (argparse's own code for usage errors).
EXIT_USAGE = 2
#: The backend is unreachable, refused us (wrong password, unknown database) or its driver is missing.
EXIT_BACKEND = 3
#: ``step-down``: the leader did not act on the request in time (it does not serve requests, or is stuck).
EXIT_NOT_STEPPED_DOWN = 4
#: ``run --no-wait``: another instance leads, CMD was not run (sysexits' EX_TEMPFAIL: try again later).
EXIT_NOT_LEADER = 75
#: ``run``: CMD could not be executed / was not found (the shell's codes).
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


class UsageError(Exception):
    """Bad options or configuration: exit status 2."""


class BackendError(Exception):
    """Backend unreachable, refused or unusable: exit status 3."""
