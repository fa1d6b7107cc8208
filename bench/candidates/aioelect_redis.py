"""aioelect's Redis backend (lease 5 s like the peers' TTL): acting as leader means ``Leadership.held``."""

from __future__ import annotations

from aioelect import RedisElector

from ._runner import Candidate, Options, main
from .aioelect_mysql import AioelectCandidate


def make(options: Options, slot: int) -> Candidate:
    return AioelectCandidate(RedisElector(options.url, name=options.name, lease=options.ttl))


if __name__ == "__main__":
    main(make)
