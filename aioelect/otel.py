"""OpenTelemetry metrics for electors (extra ``otel``: the OpenTelemetry API only).

The same series as :class:`aioelect.metrics.PrometheusMetrics`, recorded
through a ``Meter``; the application's SDK (``opentelemetry-sdk``) and its
exporters decide where they go. Nothing here is imported by aioelect
itself::

    from aioelect.otel import OpenTelemetryMetrics

    metrics = OpenTelemetryMetrics()      # the global MeterProvider, or meter_provider=...
    metrics.attach(elector)

Instruments, each with the attributes ``backend`` and ``name``:

* ``aioelect_is_leader`` (gauge): 1 while this process leads, else 0;
* ``aioelect_transitions`` (counter, attribute ``reason``): acquired, released, lost;
* ``aioelect_acquire_wait_seconds`` (histogram, unit ``s``): campaign time until leading;
* ``aioelect_check_latency_seconds`` (histogram, unit ``s``): leader checks / keep-alives;
* ``aioelect_backend_errors`` (counter): retried backend errors;
* ``aioelect_handovers`` (counter, attribute ``reason``): planned step-downs.

A Prometheus exporter of the SDK shows the counters with the ``_total``
suffix, as :class:`~aioelect.metrics.PrometheusMetrics` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _series
from .core._elector import Elector
from .core._events import Event

try:
    from opentelemetry import metrics as otel_metrics
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("OpenTelemetry metrics need opentelemetry-api: pip install 'aioelect[otel]'") from exc

__all__ = ["OpenTelemetryMetrics"]


class OpenTelemetryMetrics:
    """aioelect's instruments on one ``Meter``; attach any number of electors."""

    def __init__(self, meter_provider: Any | None = None) -> None:
        provider = meter_provider if meter_provider is not None else otel_metrics.get_meter_provider()
        meter = provider.get_meter("aioelect")
        self.meter = meter
        self.is_leader = meter.create_gauge(_series.IS_LEADER[0], description=_series.IS_LEADER[1])
        self.transitions = meter.create_counter(_series.TRANSITIONS[0], description=_series.TRANSITIONS[1])
        self.acquire_wait = meter.create_histogram(
            _series.ACQUIRE_WAIT[0],
            unit="s",
            description=_series.ACQUIRE_WAIT[1],
            explicit_bucket_boundaries_advisory=list(_series.ACQUIRE_WAIT_BUCKETS),
        )
        self.check_latency = meter.create_histogram(
            _series.CHECK_LATENCY[0],
            unit="s",
            description=_series.CHECK_LATENCY[1],
            explicit_bucket_boundaries_advisory=list(_series.CHECK_LATENCY_BUCKETS),
        )
        self.errors = meter.create_counter(_series.ERRORS[0], description=_series.ERRORS[1])
        self.handovers = meter.create_counter(_series.HANDOVERS[0], description=_series.HANDOVERS[1])

        self._sink = _OpenTelemetrySink(self)

    def attach(self, elector: Elector) -> Callable[[], None]:
        """Record ``elector``'s events from now on; return a function that detaches it."""
        self._sink.is_leader((elector.backend, elector.name), 1 if elector.leading else 0)
        return elector.add_listener(self._record)

    def _record(self, event: Event) -> None:
        _series.record(event, self._sink)


def _attributes(labels: tuple[str, str], **more: str) -> dict[str, str]:
    return {**dict(zip(_series.LABELS, labels, strict=True)), **more}


class _OpenTelemetrySink:
    def __init__(self, metrics: OpenTelemetryMetrics) -> None:
        self._m = metrics

    def is_leader(self, labels: tuple[str, str], value: int) -> None:
        self._m.is_leader.set(value, _attributes(labels))

    def transition(self, labels: tuple[str, str], reason: str) -> None:
        self._m.transitions.add(1, _attributes(labels, reason=reason))

    def acquire_wait(self, labels: tuple[str, str], seconds: float) -> None:
        self._m.acquire_wait.record(seconds, _attributes(labels))

    def check_latency(self, labels: tuple[str, str], seconds: float) -> None:
        self._m.check_latency.record(seconds, _attributes(labels))

    def error(self, labels: tuple[str, str]) -> None:
        self._m.errors.add(1, _attributes(labels))

    def handover(self, labels: tuple[str, str], reason: str) -> None:
        self._m.handovers.add(1, _attributes(labels, reason=reason))
