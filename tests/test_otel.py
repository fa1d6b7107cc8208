"""OpenTelemetry metrics: the same series, with the same values, as the Prometheus metrics, for the same events."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import prometheus_client
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from aioelect.metrics import PrometheusMetrics
from aioelect.otel import OpenTelemetryMetrics
from aioelect.testing import MemoryElector


def otel_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


async def test_opentelemetry_records_the_prometheus_series(aioelect_name: str) -> None:
    registry = prometheus_client.CollectorRegistry()
    prometheus = PrometheusMetrics(registry)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel = OpenTelemetryMetrics(meter_provider=provider)
    labels = {"backend": "memory", "name": aioelect_name}

    async with MemoryElector(name=aioelect_name, renew_deadline=0.4) as elector:
        prometheus.attach(elector)
        otel.attach(elector)
        lead = await elector.acquire()
        await asyncio.sleep(0.3)  # a few confirmations
        await lead.release()
        lead = await elector.acquire()
        await lead.step_down(timeout=0.1)  # this elector stays out for 0.1 s: nobody else campaigns
        lead = await elector.acquire()
        elector.depose("deposed by the test")
        await lead.wait_lost()
        await lead.release()
        elector.fail("down for the test")
        with anyio.move_on_after(0.5):
            await elector.acquire()
        elector.restore()

    points = otel_points(reader)
    prometheus_names = {family.name for family in registry.collect()}
    assert (
        set(points)
        == prometheus_names
        == {
            "aioelect_is_leader",
            "aioelect_transitions",
            "aioelect_acquire_wait_seconds",
            "aioelect_check_latency_seconds",
            "aioelect_backend_errors",
            "aioelect_handovers",
        }
    )

    def prom(name: str, **extra: str) -> float:
        value = registry.get_sample_value(name, {**labels, **extra})
        assert value is not None, name
        return value

    (leader,) = points["aioelect_is_leader"]
    assert dict(leader.attributes) == labels and leader.value == prom("aioelect_is_leader") == 0
    transitions = {point.attributes["reason"]: point.value for point in points["aioelect_transitions"]}
    assert transitions == {
        reason: prom("aioelect_transitions_total", reason=reason) for reason in ("acquired", "released", "lost")
    }
    assert transitions == {"acquired": 3, "released": 2, "lost": 1}
    (handovers,) = points["aioelect_handovers"]
    assert handovers.attributes["reason"] == "requested"
    assert handovers.value == prom("aioelect_handovers_total", reason="requested") == 1
    for histogram in ("aioelect_acquire_wait_seconds", "aioelect_check_latency_seconds"):
        (point,) = points[histogram]
        assert point.count == prom(f"{histogram}_count") >= 1
        assert point.sum == pytest.approx(prom(f"{histogram}_sum"))
    (errors,) = points["aioelect_backend_errors"]
    assert errors.value == prom("aioelect_backend_errors_total") >= 1
    assert list(points["aioelect_acquire_wait_seconds"][0].explicit_bounds)[:3] == [0.01, 0.05, 0.1]
