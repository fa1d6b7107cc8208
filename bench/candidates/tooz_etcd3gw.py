"""OpenStack tooz's etcd3gw lock, through etcd's JSON gRPC gateway (``/v3/`` on etcd 3.4).

Lock TTL 5 s (``lock_timeout=5``, the default is 30) so that it compares with
the other TTL-5 peers; the coordinator's heartbeat thread refreshes it every
2.5 s. Acquiring polls a compare-and-put transaction (a new lease per try)
with tenacity's exponential wait capped at 1 s. Acting as leader means
``lock.acquired``, which only ``release()`` clears.
"""

from __future__ import annotations

from ._runner import Candidate, Options, main
from ._tooz import ToozCandidate


def make(options: Options, slot: int) -> Candidate:
    url = f"etcd3+http://{options.url}?lock_timeout={options.ttl}&membership_timeout={options.ttl}"
    return ToozCandidate(url, options.name, heart=True)


if __name__ == "__main__":
    main(make)
