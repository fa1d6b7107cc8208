"""OpenStack tooz's file lock (fasteners' ``fcntl`` lock, polled every 10 to 100 ms).

Acting as leader means ``lock.acquired``.
"""

from __future__ import annotations

from ._runner import Candidate, Options, main
from ._tooz import ToozCandidate


def make(options: Options, slot: int) -> Candidate:
    return ToozCandidate(f"file://{options.url}", options.name.replace("/", "_"), heart=False)


if __name__ == "__main__":
    main(make)
