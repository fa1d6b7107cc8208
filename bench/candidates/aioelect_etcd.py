"""aioelect's etcd backend (TTL 5 s like the peers): acting as leader means ``Leadership.held``."""

from __future__ import annotations

from aioelect import EtcdElector

from ._runner import Candidate, Options, main
from .aioelect_mysql import AioelectCandidate


def make(options: Options, slot: int) -> Candidate:
    return AioelectCandidate(EtcdElector([options.url], name=options.name, ttl=options.ttl))


if __name__ == "__main__":
    main(make)
