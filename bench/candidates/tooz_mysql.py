"""OpenStack tooz's MySQL lock (tooz has no leader election on MySQL).

``lock.acquire(blocking=True)`` polls ``GET_LOCK(name, 0)`` with tenacity's
exponential wait capped at 1 s; acting as leader means ``lock.acquired``,
which tooz never re-checks against the server.
"""

from __future__ import annotations

from ._runner import Candidate, Options, main
from ._tooz import ToozCandidate


def make(options: Options, slot: int) -> Candidate:
    return ToozCandidate(options.url, options.name, heart=False)


if __name__ == "__main__":
    main(make)
