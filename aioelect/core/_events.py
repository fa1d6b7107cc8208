"""Leadership events, for callbacks, async iteration and metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Event", "EventKind", "Listener"]

EventKind = Literal[
    "campaigning", "acquired", "released", "lost", "leader", "confirmed", "error", "handover_requested", "stepped_down"
]


@dataclass(frozen=True)
class Event:
    """Something that happened to one elector.

    ``kind`` is one of:

    * ``campaigning``: :meth:`~aioelect.Elector.acquire` started waiting;
    * ``acquired``: this elector became leader (``token``, ``wait`` seconds);
    * ``released``: it gave leadership up by itself;
    * ``lost``: leadership ended for another ``reason``;
    * ``leader``: :meth:`~aioelect.Elector.observe` saw a new ``leader`` (None: nobody);
    * ``confirmed``: a check or keep-alive succeeded, ``latency`` seconds after it was sent;
    * ``error``: a backend error was retried (``reason``);
    * ``handover_requested``: this leader is stepping down (``reason``; ``successor``, None: any other);
    * ``stepped_down``: it has stepped down: its work stopped and it released (``reason``, ``successor``).

    Never carries a password or auth token.
    """

    kind: EventKind
    backend: str
    name: str
    identity: str
    token: int | None = None
    reason: str | None = None
    leader: str | None = None
    wait: float | None = None
    latency: float | None = None
    successor: str | None = None
    at: float = field(default_factory=time.time)


Listener = Callable[[Event], object]
