"""aioelect's PostgreSQL backend: acting as leader means ``Leadership.held``."""

from __future__ import annotations

from aioelect import PostgresElector

from ._runner import Candidate, Options, main
from .aioelect_mysql import AioelectCandidate


def make(options: Options, slot: int) -> Candidate:
    lease = {} if options.lease is None else {"lease": options.lease}
    return AioelectCandidate(PostgresElector(options.url, name=options.name, **lease))


if __name__ == "__main__":
    main(make)
