"""aioelect's file backend (``flock``): acting as leader means ``Leadership.held``."""

from __future__ import annotations

import os

from aioelect import FileElector

from ._runner import Candidate, Options, main
from .aioelect_mysql import AioelectCandidate


def make(options: Options, slot: int) -> Candidate:
    path = os.path.join(options.url, options.name.strip("/").replace("/", "_") + ".lock")
    return AioelectCandidate(FileElector(path, name=options.name))


if __name__ == "__main__":
    main(make)
