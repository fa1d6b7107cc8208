"""The exceptions aioelect raises."""

from __future__ import annotations

__all__ = ["BackendUnavailable", "ElectionError", "LeadershipLost"]


class ElectionError(Exception):
    """Base class of every aioelect error.

    Raised as such for misuse (``acquire()`` on an elector that is already
    campaigning, leading or closed) and for permanent backend errors that no
    retry can fix (wrong password, unknown database, unsafe topology).
    """


class LeadershipLost(ElectionError):
    """Leadership ended for a reason other than our own release.

    ``reason`` says why (lock gone, connection lost, renew deadline passed...).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"leadership lost: {reason}")
        self.reason = reason


class BackendUnavailable(ElectionError):
    """The backend's server cannot be reached (a transient condition)."""
