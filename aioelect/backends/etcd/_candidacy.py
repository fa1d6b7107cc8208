"""The states of one etcd campaign, and the table of the steps between them.

A campaign (:meth:`~._backend.EtcdBackend.campaign` and ``try_campaign``)
moves only through :data:`CANDIDACY_TRANSITIONS`, and the etcd backend's
state diagram in the docs is drawn from the same table. The table is
authoritative: a step it does not list for the current state raises
:class:`StepNotInTable` (a fault of the campaign's code, never of etcd), and
where the campaign stands is :attr:`Tracker.state` alone. What follows
LEADING (keeping and losing the leadership) is the :class:`~aioelect.Leadership`'s
own state machine.
"""

from __future__ import annotations

import enum

from ...core._transitions import Transitions

__all__ = ["CANDIDACY_TRANSITIONS", "Candidacy", "Move", "StepNotInTable", "Tracker"]


class Candidacy(enum.Enum):
    """Where one campaign stands."""

    #: No live session yet, or the last one ended (a new one is started).
    NO_SESSION = "no session"
    #: Our key is put under the session's lease; reading which key, if any, was created just before it.
    CANDIDATE = "candidate"
    #: Waiting for the deletion of the key created just before ours.
    WAITING = "waiting"
    #: Our key is the oldest under the prefix, under our live lease; ``campaign`` renews the lease first if its
    #: last keep-alive leaves less than one keep-alive interval before the renew deadline.
    WON = "won"
    #: The leadership, dated from the lease's last acknowledged keep-alive, is returned.
    LEADING = "leading"
    #: Leading locally, WITHOUT mutual exclusion, because etcd has never answered (``degrade_to_local=True``).
    LOCAL = "local"
    #: Ended without winning (cancelled, a permanent error, or ``try_acquire()`` found another first):
    #: our key is withdrawn.
    WITHDRAWN = "withdrawn"


class Move(enum.Enum):
    """What moves a campaign on."""

    SESSION = "session live"
    NEVER_ANSWERED = "etcd never answered"
    FIRST = "no older key"
    PREDECESSOR = "an older key stands"
    MAY_BE_GONE = "it may be gone, read again"
    HANDED = "it went while ours stood first"
    DATED = "dated from the last keep-alive"
    RETRY = "etcd failed, put again"
    KEY_LOST = "our key deleted by hand"
    SESSION_ENDED = "our lease ended"
    GIVE_UP = "cancelled or refused"


_C, _M = Candidacy, Move

#: Every step of a campaign; a step not listed for a state is a fault of the campaign's code (it raises).
#: A key deleted by hand is found by a read (CANDIDATE): while WAITING, the watch only says to read again.
CANDIDACY_TRANSITIONS: Transitions[Candidacy, Move] = Transitions(
    start=_C.NO_SESSION,
    final=frozenset({_C.LEADING, _C.LOCAL, _C.WITHDRAWN}),
    table={
        (_C.NO_SESSION, _M.SESSION): _C.CANDIDATE,
        (_C.NO_SESSION, _M.NEVER_ANSWERED): _C.LOCAL,
        (_C.NO_SESSION, _M.GIVE_UP): _C.WITHDRAWN,
        (_C.CANDIDATE, _M.FIRST): _C.WON,
        (_C.CANDIDATE, _M.PREDECESSOR): _C.WAITING,
        (_C.CANDIDATE, _M.RETRY): _C.CANDIDATE,
        (_C.CANDIDATE, _M.KEY_LOST): _C.CANDIDATE,
        (_C.CANDIDATE, _M.SESSION_ENDED): _C.NO_SESSION,
        (_C.CANDIDATE, _M.GIVE_UP): _C.WITHDRAWN,
        (_C.WAITING, _M.MAY_BE_GONE): _C.CANDIDATE,
        (_C.WAITING, _M.HANDED): _C.WON,
        (_C.WAITING, _M.RETRY): _C.CANDIDATE,
        (_C.WAITING, _M.SESSION_ENDED): _C.NO_SESSION,
        (_C.WAITING, _M.GIVE_UP): _C.WITHDRAWN,
        (_C.WON, _M.DATED): _C.LEADING,
        (_C.WON, _M.SESSION_ENDED): _C.NO_SESSION,
        (_C.WON, _M.GIVE_UP): _C.WITHDRAWN,
    },
)


class StepNotInTable(AssertionError):
    """A campaign took a step :data:`CANDIDACY_TRANSITIONS` does not list for its state: a bug of the campaign."""


class Tracker:
    """Where the current campaign stands, moved only through :data:`CANDIDACY_TRANSITIONS`."""

    def __init__(self) -> None:
        self.state = CANDIDACY_TRANSITIONS.start

    def begin(self) -> None:
        """A new campaign starts with no session in hand."""
        self.state = CANDIDACY_TRANSITIONS.start

    def move(self, step: Move) -> Candidacy:
        """Take ``step``; the new state. :class:`StepNotInTable` (the state unchanged) if the table does not
        allow ``step`` from the current state."""
        target = CANDIDACY_TRANSITIONS.next(self.state, step)
        if target is None:
            raise StepNotInTable(f"etcd campaign: step {step.value!r} is not in the table from {self.state.name}")
        self.state = target
        return target
