"""Prometheus metrics for electors (extra ``prometheus``).

Nothing here is imported by aioelect itself: without the extra there is no
cost at all. With it::

    from aioelect.metrics import PrometheusMetrics

    metrics = PrometheusMetrics()        # registers on the default registry
    metrics.attach(elector)
    metrics.serve(9464)                   # 127.0.0.1 unless told otherwise

Metrics, each labelled by ``backend`` and ``name``:

* ``aioelect_is_leader`` (gauge): 1 while this process leads, else 0;
* ``aioelect_transitions_total{reason}`` (counter): acquired, released, lost;
* ``aioelect_acquire_wait_seconds`` (histogram): campaign time until leading;
* ``aioelect_check_latency_seconds`` (histogram): leader checks / keep-alives;
* ``aioelect_backend_errors_total`` (counter): retried backend errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _series
from ._elector import Elector
from ._events import Event

try:
    import prometheus_client
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("metrics need prometheus-client: pip install 'aioelect[prometheus]'") from exc

__all__ = ["PrometheusMetrics"]

_LABELS = _series.LABELS


class PrometheusMetrics:
    """One set of aioelect collectors on one registry; attach any number of electors.

    :class:`aioelect.otel.OpenTelemetryMetrics` records the same series.
    """

    def __init__(self, registry: prometheus_client.CollectorRegistry | None = None) -> None:
        reg: Any = registry if registry is not None else prometheus_client.REGISTRY
        self.registry = reg
        self.is_leader = prometheus_client.Gauge(*_series.IS_LEADER, _LABELS, registry=reg)
        self.transitions = prometheus_client.Counter(*_series.TRANSITIONS, (*_LABELS, "reason"), registry=reg)
        self.acquire_wait = prometheus_client.Histogram(
            *_series.ACQUIRE_WAIT, _LABELS, buckets=_series.ACQUIRE_WAIT_BUCKETS, registry=reg
        )
        self.check_latency = prometheus_client.Histogram(
            *_series.CHECK_LATENCY, _LABELS, buckets=_series.CHECK_LATENCY_BUCKETS, registry=reg
        )
        self.errors = prometheus_client.Counter(*_series.ERRORS, _LABELS, registry=reg)
        self._sink = _PrometheusSink(self)

    def attach(self, elector: Elector) -> Callable[[], None]:
        """Record ``elector``'s events from now on; return a function that detaches it."""
        self.is_leader.labels(elector.backend, elector.name).set(1 if elector.leading else 0)
        return elector.add_listener(self._record)

    def _record(self, event: Event) -> None:
        _series.record(event, self._sink)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Expose this registry over HTTP on ``host:port`` (loopback by default), in a daemon thread.

        This is prometheus_client's server: one thread per connection and no
        connection limit, so keep it off addresses untrusted clients reach
        (``aioelect run --metrics-port`` serves from a bounded server instead).
        """
        prometheus_client.start_http_server(port, addr=host, registry=self.registry)


class _PrometheusSink:
    def __init__(self, metrics: PrometheusMetrics) -> None:
        self._m = metrics

    def is_leader(self, labels: tuple[str, str], value: int) -> None:
        self._m.is_leader.labels(*labels).set(value)

    def transition(self, labels: tuple[str, str], reason: str) -> None:
        self._m.transitions.labels(*labels, reason).inc()

    def acquire_wait(self, labels: tuple[str, str], seconds: float) -> None:
        self._m.acquire_wait.labels(*labels).observe(seconds)

    def check_latency(self, labels: tuple[str, str], seconds: float) -> None:
        self._m.check_latency.labels(*labels).observe(seconds)

    def error(self, labels: tuple[str, str]) -> None:
        self._m.errors.labels(*labels).inc()
