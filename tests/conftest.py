"""Shared test setup: the real-server harness fixtures and logging."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from .faults import EventProcess

pytest_plugins = ["aioelect.testing"]

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
