"""OpenStack tooz's PostgreSQL lock: ``pg_advisory_lock`` on a connection of its own.

Blocking ``acquire()`` waits inside the server; acting as leader means
``lock.acquired``, which tooz never re-checks against the server.
"""

from __future__ import annotations

from ._runner import Candidate, Options, main
from ._tooz import ToozCandidate


def make(options: Options, slot: int) -> Candidate:
    return ToozCandidate(options.url, options.name, heart=False)


if __name__ == "__main__":
    main(make)
