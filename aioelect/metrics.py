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

from ._elector import Elector
from ._events import Event

try:
    import prometheus_client
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("metrics need prometheus-client: pip install 'aioelect[prometheus]'") from exc

__all__ = ["PrometheusMetrics"]

_LABELS = ("backend", "name")


class PrometheusMetrics:
    """One set of aioelect collectors on one registry; attach any number of electors."""

    def __init__(self, registry: prometheus_client.CollectorRegistry | None = None) -> None:
        reg: Any = registry if registry is not None else prometheus_client.REGISTRY
        self.registry = reg
        self.is_leader = prometheus_client.Gauge(
            "aioelect_is_leader", "1 while this process leads the election", _LABELS, registry=reg
        )
        self.transitions = prometheus_client.Counter(
            "aioelect_transitions", "Leadership transitions by reason", (*_LABELS, "reason"), registry=reg
        )
        self.acquire_wait = prometheus_client.Histogram(
            "aioelect_acquire_wait_seconds",
            "Time from campaigning to leading",
            _LABELS,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 3600),
            registry=reg,
        )
        self.check_latency = prometheus_client.Histogram(
            "aioelect_check_latency_seconds",
            "Latency of the leader's confirmations (checks, keep-alives)",
            _LABELS,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=reg,
        )
        self.errors = prometheus_client.Counter(
            "aioelect_backend_errors", "Backend errors that were retried", _LABELS, registry=reg
        )

    def attach(self, elector: Elector) -> Callable[[], None]:
        """Record ``elector``'s events from now on; return a function that detaches it."""
        self.is_leader.labels(elector.backend, elector.name).set(1 if elector.leading else 0)
        return elector.add_listener(self._record)

    def _record(self, event: Event) -> None:
        labels = (event.backend, event.name)
        if event.kind == "acquired":
            self.is_leader.labels(*labels).set(1)
            self.transitions.labels(*labels, "acquired").inc()
            if event.wait is not None:
                self.acquire_wait.labels(*labels).observe(event.wait)
        elif event.kind in ("released", "lost"):
            self.is_leader.labels(*labels).set(0)
            self.transitions.labels(*labels, event.kind).inc()
        elif event.kind == "confirmed" and event.latency is not None:
            self.check_latency.labels(*labels).observe(event.latency)
        elif event.kind == "error":
            self.errors.labels(*labels).inc()

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Expose this registry over HTTP on ``host:port`` (loopback by default), in a daemon thread.

        This is prometheus_client's server: one thread per connection and no
        connection limit, so keep it off addresses untrusted clients reach
        (``aioelect run --metrics-port`` serves from a bounded server instead).
        """
        prometheus_client.start_http_server(port, addr=host, registry=self.registry)
