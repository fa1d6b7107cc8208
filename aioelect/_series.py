"""The metric series aioelect records, written once for every exporter (Prometheus, OpenTelemetry).

Each exporter gives :func:`record` a :class:`Sink` of its own instruments,
so the series' names, meanings, buckets and the events that move them are
the same whichever exporter a process uses.
"""

from __future__ import annotations

from typing import Protocol

from .core._events import Event

__all__ = [
    "ACQUIRE_WAIT",
    "CHECK_LATENCY",
    "ERRORS",
    "HANDOVERS",
    "IS_LEADER",
    "LABELS",
    "TRANSITIONS",
    "Sink",
    "record",
]

#: The labels (attributes) of every series.
LABELS = ("backend", "name")
#: (name, description) of each series; counters' names without the ``_total`` Prometheus adds.
IS_LEADER = ("aioelect_is_leader", "1 while this process leads the election")
TRANSITIONS = ("aioelect_transitions", "Leadership transitions by reason")
ACQUIRE_WAIT = ("aioelect_acquire_wait_seconds", "Time from campaigning to leading")
CHECK_LATENCY = ("aioelect_check_latency_seconds", "Latency of the leader's confirmations (checks, keep-alives)")
ERRORS = ("aioelect_backend_errors", "Backend errors that were retried")
HANDOVERS = ("aioelect_handovers", "Planned step-downs by reason")
#: Histogram bucket bounds, in seconds.
ACQUIRE_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
CHECK_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Sink(Protocol):
    """An exporter's instruments, one method per series; ``labels`` is ``(backend, name)``."""

    def is_leader(self, labels: tuple[str, str], value: int) -> None: ...

    def transition(self, labels: tuple[str, str], reason: str) -> None: ...

    def acquire_wait(self, labels: tuple[str, str], seconds: float) -> None: ...

    def check_latency(self, labels: tuple[str, str], seconds: float) -> None: ...

    def error(self, labels: tuple[str, str]) -> None: ...

    def handover(self, labels: tuple[str, str], reason: str) -> None: ...


def record(event: Event, sink: Sink) -> None:
    """Move the series ``event`` moves."""
    labels = (event.backend, event.name)
    if event.kind == "acquired":
        sink.is_leader(labels, 1)
        sink.transition(labels, "acquired")
        if event.wait is not None:
            sink.acquire_wait(labels, event.wait)
    elif event.kind in ("released", "lost"):
        sink.is_leader(labels, 0)
        sink.transition(labels, event.kind)
    elif event.kind == "confirmed" and event.latency is not None:
        sink.check_latency(labels, event.latency)
    elif event.kind == "error":
        sink.error(labels)
    elif event.kind == "stepped_down":
        sink.handover(labels, event.reason or "requested")
