"""Shared test setup: the real-server harness fixtures and logging."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .faults import EventProcess

if TYPE_CHECKING:
    from .test_cli import Spawner

# The real-server harness's fixtures (mariadb, etcd, postgres, certs, tcp_proxy_factory...).
pytest_plugins = ["tests.harness.plugin"]

logging.getLogger("aioelect").setLevel(logging.DEBUG)


@pytest.fixture
def procs() -> Iterator[list[EventProcess]]:
    """Processes a test starts; every one is killed and reaped afterwards."""
    started: list[EventProcess] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.kill()


@pytest.fixture
def spawner(tmp_path: Path) -> Iterator[Spawner]:
    """``aioelect`` command-line processes; every one is killed and reaped afterwards."""
    from .test_cli import Spawner  # imported late: a conftest that imports test modules would collect them twice

    started = Spawner(tmp_path)
    try:
        yield started
    finally:
        started.cleanup()
