"""Prometheus metrics for electors (extra ``prometheus``).

Nothing here is imported by aioelect itself: without the extra there is no
cost at all. With it::

    from aioelect.metrics import PrometheusMetrics

    metrics = PrometheusMetrics()        # registers on the default registry
    metrics.attach(elector)
    server = metrics.serve(9464)          # 127.0.0.1 unless told otherwise; server.close() stops it

Metrics, each labelled by ``backend`` and ``name``:

* ``aioelect_is_leader`` (gauge): 1 while this process leads, else 0;
* ``aioelect_transitions_total{reason}`` (counter): acquired, released, lost;
* ``aioelect_acquire_wait_seconds`` (histogram): campaign time until leading;
* ``aioelect_check_latency_seconds`` (histogram): leader checks / keep-alives;
* ``aioelect_backend_errors_total`` (counter): retried backend errors;
* ``aioelect_handovers_total{reason}`` (counter): planned step-downs.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from . import _series
from ._http import BoundedHTTPServer
from .core._elector import Elector
from .core._events import Event

try:
    import prometheus_client
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("metrics need prometheus-client: pip install 'aioelect[prometheus]'") from exc

__all__ = ["MetricsServer", "PrometheusMetrics"]

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
        self.handovers = prometheus_client.Counter(*_series.HANDOVERS, (*_LABELS, "reason"), registry=reg)
        self._sink = _PrometheusSink(self)

    def attach(self, elector: Elector) -> Callable[[], None]:
        """Record ``elector``'s events from now on; return a function that detaches it."""
        self.is_leader.labels(elector.backend, elector.name).set(1 if elector.leading else 0)
        return elector.add_listener(self._record)

    def _record(self, event: Event) -> None:
        _series.record(event, self._sink)

    async def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        """The answer to a ``GET`` (or ``HEAD``) of ``path``: this registry's page on ``/metrics``, else 404."""
        if path != "/metrics":
            return 404, "text/plain; charset=utf-8", b"metrics are on /metrics\n"
        return 200, prometheus_client.CONTENT_TYPE_LATEST, prometheus_client.generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1", *, max_connections: int | None = None) -> MetricsServer:
        """Serve this registry on ``http://host:port/metrics`` (loopback by default) from a daemon thread.

        Returns once the server listens (OSError if it cannot). The server
        is the bounded one of the health probes, in an event loop of its own
        thread: at most ``max_connections`` connections at once (default 32,
        never more than an eighth of the descriptor limit), the rest reset
        as soon as accepted; a request head must arrive within 5 s; no
        thread per connection. Idle or slow clients cannot pile up threads
        or descriptors, nor slow the event loop of the elector it reports on.
        """
        return MetricsServer(self, host, port, max_connections=max_connections)


class MetricsServer:
    """A running :meth:`PrometheusMetrics.serve`: one daemon thread running one event loop and the bounded server.

    :meth:`close` stops it and waits for the thread (at most 5 s).
    """

    def __init__(self, metrics: PrometheusMetrics, host: str, port: int, *, max_connections: int | None) -> None:
        self.http = BoundedHTTPServer(metrics.respond, name="metrics", max_connections=max_connections)
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(host, port),), daemon=True)
        self._thread.name = f"aioelect-metrics-{port}"
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure
        #: The port the server listens on (the one given, or the one the system chose for 0).
        self.port = self.http.port

    async def _run(self, host: str, port: int) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            await self.http.start(host, port)
        except BaseException as exc:  # raised again by the constructor, in the caller's thread
            self._failure = exc
            await self.http.aclose()
            return
        finally:
            self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.http.aclose()

    def close(self) -> None:
        """Stop listening, close every connection and end the thread. Idempotent."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop has just ended by itself
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(5)


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

    def handover(self, labels: tuple[str, str], reason: str) -> None:
        self._m.handovers.labels(*labels, reason).inc()
