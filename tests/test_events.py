"""Events and Prometheus metrics, on the local backend and on a real MariaDB."""

from __future__ import annotations

import asyncio
import logging
import urllib.request

import anyio
import pytest

from aioelect import Event, LocalElector, MySQLElector, leadership

from .backends import unique_name
from .harness import MariaDBServer, free_port


async def test_listener_sees_transitions_in_order() -> None:
    seen: list[Event] = []
    async with LocalElector(name="evt", identity="me") as elector:
        remove = elector.add_listener(seen.append)
        lead = await elector.acquire()
        await lead.release()
        remove()
        lead = await elector.acquire()
        await lead.release()
    kinds = [e.kind for e in seen]
    assert kinds == ["campaigning", "acquired", "released"]
    acquired = seen[1]
    assert (acquired.backend, acquired.name, acquired.identity) == ("local", "evt", "me")
    assert acquired.token is not None and acquired.wait is not None


async def test_failing_listener_does_not_break_the_election(caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    async with LocalElector() as elector:
        elector.add_listener(broken)
        async with leadership(elector) as lead:
            assert lead.held
    assert "listener" in caplog.text


async def test_events_iterator_reports_loss_with_reason(mariadb: MariaDBServer) -> None:
    name = unique_name()
    async with MySQLElector(mariadb.dsn, name=name, check_interval=0.3, check_timeout=0.7) as elector:
        seen: list[Event] = []

        async def collect() -> None:
            async for event in elector.events():
                seen.append(event)

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            await asyncio.sleep(0)
            lead = await elector.acquire()
            await asyncio.sleep(0.5)  # at least one confirmation
            holder = mariadb.query("SELECT IS_USED_LOCK(%s)", (name,), database="")[0][0]
            mariadb.query(f"KILL {int(holder)}", database="")
            with anyio.fail_after(5):
                await lead.wait_lost()
            await asyncio.sleep(0.05)
            tg.cancel_scope.cancel()
    kinds = [e.kind for e in seen]
    assert kinds[:2] == ["campaigning", "acquired"]
    assert "confirmed" in kinds
    lost = [e for e in seen if e.kind == "lost"]
    assert len(lost) == 1 and lost[0].reason and "released" not in kinds


async def test_prometheus_metrics(mariadb: MariaDBServer) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from aioelect.metrics import PrometheusMetrics

    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    name = unique_name()
    labels = {"backend": "mysql", "name": name}

    def value(metric: str, **extra: str) -> float | None:
        result: float | None = registry.get_sample_value(metric, {**labels, **extra})
        return result

    async with MySQLElector(mariadb.dsn, name=name, check_interval=0.2, check_timeout=0.7) as elector:
        metrics.attach(elector)
        assert value("aioelect_is_leader") == 0
        lead = await elector.acquire()
        assert value("aioelect_is_leader") == 1
        await asyncio.sleep(0.5)
        assert (value("aioelect_check_latency_seconds_count") or 0) >= 1
        await lead.release()
        assert value("aioelect_is_leader") == 0
    assert value("aioelect_transitions_total", reason="acquired") == 1
    assert value("aioelect_transitions_total", reason="released") == 1
    assert value("aioelect_acquire_wait_seconds_count") == 1

    async with MySQLElector(f"mysql://root@127.0.0.1:{free_port()}/x", name=name, connect_timeout=0.3) as unreachable:
        metrics.attach(unreachable)
        with anyio.move_on_after(1.0):
            await unreachable.acquire()
    assert (value("aioelect_backend_errors_total") or 0) >= 1

    port = free_port()
    server = metrics.serve(port)
    try:
        body = await anyio.to_thread.run_sync(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        )
        assert "aioelect_transitions_total" in body
        with pytest.raises(OSError):  # the port is taken: the caller hears of it
            metrics.serve(port)
    finally:
        server.close()
    assert not server._thread.is_alive()


def test_log_lines_keep_a_percent_sign_of_the_election_name(caplog: pytest.LogCaptureFixture) -> None:
    """An election name may hold '%' (a percent-encoded name): log lines with and without arguments show it as is,
    pointing at the caller's line."""
    from aioelect.core._log import ElectionLog

    log = ElectionLog("etcd", "jobs/a%2Fb%s", "me")
    with caplog.at_level(logging.DEBUG, logger="aioelect"):
        log.info("campaigning; %s", "timing")
        log.warning("no arguments 100%")
    assert [r.getMessage() for r in caplog.records] == [
        "[etcd jobs/a%2Fb%s me] campaigning; timing",
        "[etcd jobs/a%2Fb%s me] no arguments 100%",
    ]
    assert {r.filename for r in caplog.records} == {"test_events.py"}
