"""The errors the harness raises: every one is a :class:`HarnessError`.

:class:`MissingBinaryError` alone means "not installed here"; the pytest
plugin turns it into a skip (a failure in CI). Any other harness error is a
failure wherever it happens.
"""

from __future__ import annotations

__all__ = ["HarnessError", "MissingBinaryError", "ServerStartError"]


class HarnessError(RuntimeError):
    """Base class of every error raised by the harness."""


class MissingBinaryError(HarnessError):
    """A server binary needed by the harness is not installed."""


class ServerStartError(HarnessError):
    """A server did not become ready in time (message includes its log tail)."""
