"""Shared test setup: the real-server harness fixtures and logging."""

from __future__ import annotations

import logging

pytest_plugins = ["aioelect.testing"]

logging.getLogger("aioelect").setLevel(logging.DEBUG)
