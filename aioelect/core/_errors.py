"""The exceptions aioelect raises, and the kinds of loss a program can branch on."""

from __future__ import annotations

import enum

__all__ = [
    "BackendMisconfigured",
    "BackendUnavailable",
    "ElectionError",
    "ElectorClosed",
    "LeadershipLost",
    "LossKind",
    "PermanentBackendError",
    "UsageError",
]


class ElectionError(Exception):
    """Base class of every aioelect error.

    Catch a subclass to tell causes apart: :class:`UsageError` (a call this
    elector cannot take now), :class:`ElectorClosed`,
    :class:`PermanentBackendError` (no retry can fix it),
    :class:`BackendUnavailable` (transient), :class:`LeadershipLost`.
    """


class UsageError(ElectionError):
    """A call the elector cannot take in its state: ``acquire()`` while campaigning or leading,
    ``current_leadership()`` outside leader work, changing ``identity`` while not idle."""


class ElectorClosed(ElectionError):
    """The elector (or the shared session it uses) is closed: it campaigns no more."""


class PermanentBackendError(ElectionError):
    """The backend refused for a reason no retry can fix: wrong password, unknown database, unsafe topology,
    missing privilege, an unreadable certificate. Raised at once, never retried."""


class BackendMisconfigured(PermanentBackendError):
    """The configuration names what the servers do not have (a master name no Sentinel monitors): the
    configuration must change. Raised at once, never retried."""


class LossKind(enum.Enum):
    """Why a leadership was lost, for a program to branch on (:attr:`LeadershipLost.kind`)."""

    #: Someone else took the lock or removed our key.
    DEPOSED = "deposed"
    #: The server's lease or time-to-live ran out.
    EXPIRED = "expired"
    #: The connection or session the leadership lived on is gone.
    CONNECTION_LOST = "connection lost"
    #: The server ended the leadership itself (it took the election back).
    RELEASED_BY_SERVER = "released by the server"
    #: We stopped leading on our own: the renew deadline passed without a confirmation, or nobody held the
    #: leadership any more.
    SELF_FENCED = "self-fenced"


class LeadershipLost(ElectionError):
    """Leadership ended for a reason other than our own release.

    ``reason`` says why, for a person (lock gone, connection lost, renew
    deadline passed...); ``kind`` says it as a :class:`LossKind`, for a
    program; None when :meth:`~aioelect.Leadership.check` found it ended by
    our own release, not lost.
    """

    def __init__(self, reason: str, kind: LossKind | None = None) -> None:
        super().__init__(f"leadership lost: {reason}")
        self.reason = reason
        self.kind = kind

    def __reduce__(self) -> tuple[type[LeadershipLost], tuple[str, LossKind | None]]:
        return LeadershipLost, (self.reason, self.kind)


class BackendUnavailable(ElectionError):
    """The backend's server cannot be reached (a transient condition)."""


# Pickled and shown under the names users import (``aioelect.LeadershipLost``), wherever this module lives: an
# exception a process of one release pickled (multiprocessing, a task queue's results) loads in another.
for _public in (
    ElectionError,
    UsageError,
    ElectorClosed,
    PermanentBackendError,
    LossKind,
    LeadershipLost,
    BackendUnavailable,
):
    _public.__module__ = "aioelect"
