"""The integrations against the real library and the real frameworks: APScheduler 3.x, Starlette served
by uvicorn, aiohttp's server, and the health probes ``aioelect run --health-port`` serves.

Everything listens on 127.0.0.1 only; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web
from apscheduler.events import EVENT_JOB_EXECUTED, EVENT_JOB_MISSED, EVENT_SCHEDULER_RESUMED
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.base import STATE_PAUSED, STATE_RUNNING
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import aioelect
from aioelect import FileElector, MySQLElector
from aioelect.cli._args import build_parser, split_command
from aioelect.cli._configure import configure
from aioelect.integrations import Campaign, asgi
from aioelect.integrations import aiohttp as aiohttp_integration
from aioelect.integrations.aiohttp import election_ctx
from aioelect.integrations.apscheduler import LeaderScheduler
from aioelect.integrations.asgi import election_lifespan
from aioelect.integrations.health import MAX_REQUEST, PATHS, HealthServer
from aioelect.testing import MemoryElector
from aioelect.wiring._factory import priority_from
from aioelect.wiring._settings import Settings

MakeMemory = Callable[..., MemoryElector]


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` every 10 ms; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


# --- APScheduler ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    instance: str
    start: float
    end: float = float("inf")
    token: int | None = None
    cancelled: bool = False


def job_recorder(instance: str, runs: list[Run], duration: float) -> Callable[[], Awaitable[None]]:
    """A coroutine job that records when it ran on ``instance`` and the token of the leadership it ran under."""

    async def job() -> None:
        lead = aioelect.current_leadership()
        lead.check()
        run = Run(instance, time.monotonic(), token=lead.token)
        runs.append(run)
        try:
            await asyncio.sleep(duration)
        except asyncio.CancelledError:
            run.cancelled = True
            raise
        finally:
            run.end = time.monotonic()

    return job


def overlaps(runs: list[Run], margin: float) -> list[tuple[Run, Run]]:
    """Pairs of runs on different instances that ran at the same time for longer than ``margin`` seconds."""
    found = []
    for i, one in enumerate(runs):
        for other in runs[i + 1 :]:
            if one.instance != other.instance and min(one.end, other.end) - max(one.start, other.start) > margin:
                found.append((one, other))
    return found


def scheduler_with(job: Callable[[], Awaitable[None]], every: float, **options: Any) -> AsyncIOScheduler:
    scheduler = AsyncIOScheduler()
    scheduler.add_job(job, "interval", seconds=every, id="job", **options)
    return scheduler


async def test_apscheduler_jobs_run_only_on_the_leader_and_move_with_leadership(memory_elector: MakeMemory) -> None:
    runs: list[Run] = []
    schedulers = {
        name: LeaderScheduler(scheduler_with(job_recorder(name, runs, 0.05), 0.1), memory_elector(name))
        for name in ("a", "b")
    }
    async with schedulers["a"] as a, schedulers["b"] as b:
        await wait_for(lambda: a.role == "leader" or b.role == "leader", what="a leader")
        first, second = (a, b) if a.role == "leader" else (b, a)
        assert second.role == "follower"
        await wait_for(lambda: len(runs) >= 4, what="four runs on the leader")
        assert {run.instance for run in runs} == {first.elector.identity}
        assert first.scheduler.state == STATE_RUNNING and second.scheduler.state == STATE_PAUSED

        deposed_at = time.monotonic()
        assert memory_elector().depose() == first.elector.identity
        await wait_for(lambda: second.role == "leader", what="the follower to take over")
        await wait_for(
            lambda: sum(r.instance == second.elector.identity for r in runs) >= 4, what="four runs on the new leader"
        )
        # The deposed scheduler is paused and campaigns again; its runs stopped at the loss.
        assert first.scheduler.state == STATE_PAUSED and first.role == "follower"
        assert all(r.start < deposed_at for r in runs if r.instance == first.elector.identity)
        late = [r for r in runs if r.instance == first.elector.identity and r.end > deposed_at + 0.1]
        assert late == [], f"runs of the deposed leader went on after the loss: {late}"
        # Never two instances at once, beyond the event-loop iteration a loss takes to cancel a run.
        assert overlaps(runs, margin=0.05) == []
        tokens = {r.instance: r.token for r in runs}
        first_token, second_token = tokens[first.elector.identity], tokens[second.elector.identity]
        assert first_token is not None and second_token is not None and second_token > first_token
    assert a.role == b.role == "stopped"
    assert not a.scheduler.running and not b.scheduler.running


async def test_apscheduler_on_the_file_backend_hands_over_on_stop_without_overlap(tmp_path: Path) -> None:
    """Two electors on one lock file (a real flock): stopping the leader cancels its run, then hands over."""
    runs: list[Run] = []
    lock = tmp_path / "scheduler.lock"
    a = LeaderScheduler(scheduler_with(job_recorder("a", runs, 0.3), 0.1), FileElector(lock, identity="a"))
    b = LeaderScheduler(scheduler_with(job_recorder("b", runs, 0.3), 0.1), FileElector(lock, identity="b"))
    released: list[float] = []
    a.elector.add_listener(lambda event: released.append(time.monotonic()) if event.kind == "released" else None)
    try:
        await a.start()
        await wait_for(lambda: a.role == "leader", what="a to lead")
        await b.start()
        await wait_for(lambda: any(r.instance == "a" for r in runs), what="a run on a")
        assert b.role == "follower"
        assert (await b.status()).leader == "a"
        await a.stop()  # releases: its run in progress is cancelled and has ended before the lock goes
        assert a.role == "stopped"
        last = [r for r in runs if r.instance == "a"][-1]
        assert last.cancelled, "the run in progress on a was not cancelled"
        assert len(released) == 1 and last.end < released[0], "a's run was still going when the lock was let go"
        await wait_for(lambda: any(r.instance == "b" for r in runs), what="a run on b")
        assert overlaps(runs, margin=0.0) == []
        assert {r.token for r in runs if r.instance == "b"} == {(await b.status()).token}
    finally:
        await a.stop()
        await b.stop()


async def test_apscheduler_on_mariadb_hands_over_on_stop_without_overlap(mysql_dsn: str) -> None:
    """Two instances on a real MariaDB election: the leader's runs stop before its lock goes, the other one
    takes over with a larger fencing token, and no run overlaps."""
    runs: list[Run] = []
    name = f"integrations-{secrets.token_hex(4)}"
    options: dict[str, Any] = {"name": name, "fencing": True, "check_interval": 0.2, "poll_interval": 0.1}
    a = LeaderScheduler(
        scheduler_with(job_recorder("a", runs, 0.3), 0.1), MySQLElector(mysql_dsn, identity="a", **options)
    )
    b = LeaderScheduler(
        scheduler_with(job_recorder("b", runs, 0.3), 0.1), MySQLElector(mysql_dsn, identity="b", **options)
    )
    try:
        await a.start()
        await wait_for(lambda: a.role == "leader", timeout=15, what="a to lead")
        await b.start()
        await wait_for(lambda: any(r.instance == "a" for r in runs), what="a run on a")
        await wait_for(lambda: b.role == "follower", what="b to campaign")
        assert (await b.status()).leader == "a"
        await a.stop()
        await wait_for(lambda: any(r.instance == "b" for r in runs), timeout=15, what="a run on b")
        assert overlaps(runs, margin=0.0) == []
        token_a = {r.token or 0 for r in runs if r.instance == "a"}
        token_b = {r.token or 0 for r in runs if r.instance == "b"}
        assert len(token_a) == len(token_b) == 1 and min(token_b) > max(token_a)
    finally:
        await a.stop()
        await b.stop()


async def takeover_runs(memory_elector: MakeMemory, follow_for: float, **job_options: Any) -> tuple[int, int]:
    """``(executed, missed)``: what the new leader did with the slots of a job due every 0.1 s that fell due
    while it followed for ``follow_for`` seconds (APScheduler's own events, by scheduled time)."""
    runs: list[Run] = []
    events: list[tuple[int, float]] = []
    resumed: list[float] = []
    scheduler = scheduler_with(job_recorder("f", runs, 0.0), 0.1, **job_options)
    scheduler.add_listener(
        lambda e: events.append((e.code, e.scheduled_run_time.timestamp())), EVENT_JOB_EXECUTED | EVENT_JOB_MISSED
    )
    scheduler.add_listener(lambda e: resumed.append(time.time()), EVENT_SCHEDULER_RESUMED)
    leader = memory_elector("leader")
    lead = await leader.acquire()
    follower = LeaderScheduler(scheduler, memory_elector("f"))
    async with follower:
        await asyncio.sleep(follow_for)
        assert runs == [] and events == [] and follower.role == "follower"
        memory_elector().depose()
        await wait_for(lambda: follower.role == "leader" and bool(resumed), what="the follower to take over")
        await asyncio.sleep(0.3)
        assert not lead.held
    catch_up = [code for code, scheduled in events if scheduled <= resumed[0]]
    return catch_up.count(EVENT_JOB_EXECUTED), catch_up.count(EVENT_JOB_MISSED)


async def test_apscheduler_handover_coalesce_runs_missed_slots_once(memory_elector: MakeMemory) -> None:
    """coalesce=True (the default): the slots that fell due during the follower's second run once, at once."""
    assert await takeover_runs(memory_elector, 1.0, coalesce=True) == (1, 0)


async def test_apscheduler_handover_without_coalesce_runs_every_missed_slot(memory_elector: MakeMemory) -> None:
    """coalesce=False, misfire_grace_time=None: each slot missed while following runs at takeover (a burst)."""
    executed, missed = await takeover_runs(memory_elector, 1.0, coalesce=False, misfire_grace_time=None)
    assert executed >= 9 and missed == 0


async def test_apscheduler_handover_drops_slots_older_than_misfire_grace_time(memory_elector: MakeMemory) -> None:
    """coalesce=False with a grace time (whole seconds) shorter than the time followed: the slots of the last
    second run, the older ones are reported missed."""
    executed, missed = await takeover_runs(memory_elector, 2.5, coalesce=False, misfire_grace_time=1)
    assert 9 <= executed <= 11 and missed >= 13 and 23 <= executed + missed <= 27


async def test_apscheduler_thread_jobs_start_only_on_the_leader_and_see_its_token(memory_elector: MakeMemory) -> None:
    """A plain function runs in APScheduler's thread pool, under the leadership's context all the same."""
    seen: list[tuple[str, int | None]] = []

    def job(instance: str) -> None:
        lead = aioelect.current_leadership()
        lead.check()
        seen.append((instance, lead.token))

    schedulers = {}
    for name in ("a", "b"):
        scheduler = AsyncIOScheduler()
        scheduler.add_job(job, "interval", seconds=0.1, args=[name], id="job")
        schedulers[name] = LeaderScheduler(scheduler, memory_elector(name))
    async with schedulers["a"] as a, schedulers["b"] as b:
        await wait_for(lambda: len(seen) >= 3, what="three runs")
        leader = a if a.role == "leader" else b
        lead = leader.leadership
        assert lead is not None
        assert set(seen) == {(leader.elector.identity, lead.token)}


async def test_apscheduler_refuses_a_started_scheduler(memory_elector: MakeMemory) -> None:
    scheduler = AsyncIOScheduler()
    scheduler.start(paused=True)
    try:
        with pytest.raises(ValueError, match="not started"):
            LeaderScheduler(scheduler, memory_elector("a"))
    finally:
        scheduler.shutdown(wait=False)


async def test_campaign_reports_a_permanent_error_as_failed(tmp_path: Path) -> None:
    """A campaign that cannot go on (a lock path that is a symbolic link: refused) ends as failed, says why."""
    (tmp_path / "target").write_text("")
    bad = tmp_path / "link"
    bad.symlink_to(tmp_path / "target")
    campaign = Campaign(FileElector(bad, identity="a"))
    await campaign.start()
    try:
        await wait_for(lambda: campaign.role == "failed", what="the campaign to fail")
        status = await campaign.status()
        assert status.role == "failed" and status.error and "link" in status.error
        assert not campaign.healthy
    finally:
        await campaign.stop()
    assert campaign.role == "failed"


# --- Starlette (served by uvicorn) and aiohttp -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def serve_asgi(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a free port), lifespan included; yield its base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started or task.done(), what="uvicorn to start")
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        sock.close()


@contextlib.asynccontextmanager
async def serve_aiohttp(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` with aiohttp on 127.0.0.1 (a free port), cleanup_ctx included; yield its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await asyncio.wait_for(runner.cleanup(), 15)


async def get_json(url: str) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(url)
        return response.status_code, response.json()


def starlette_app(elector: aioelect.Elector, served: list[str]) -> Starlette:
    async def hello(request: Request) -> PlainTextResponse:
        served.append(elector.identity)
        return PlainTextResponse("hello")

    return Starlette(
        lifespan=election_lifespan(elector),
        routes=[
            asgi.status_route("/leader"),
            asgi.status_route("/leader-only", leader_only=True),
            Route("/hello", hello),
        ],
    )


def aiohttp_app(elector: aioelect.Elector, served: list[str]) -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        served.append(elector.identity)
        return web.Response(text="hello")

    app = web.Application()
    app.cleanup_ctx.append(election_ctx(elector))
    app.router.add_get("/leader", aiohttp_integration.status_handler)
    app.router.add_get("/leader-only", aiohttp_integration.leader_only_handler)
    app.router.add_get("/hello", hello)
    return app


Serve = Callable[[Any], contextlib.AbstractAsyncContextManager[str]]
MakeApp = Callable[[aioelect.Elector, list[str]], Any]
FRAMEWORKS = [
    pytest.param(starlette_app, serve_asgi, id="starlette"),
    pytest.param(aiohttp_app, serve_aiohttp, id="aiohttp"),
]


async def leaders(urls: list[str]) -> list[dict[str, Any]]:
    return [body for _, body in [await get_json(url + "/leader") for url in urls]]


@pytest.mark.parametrize(("make_app", "serve"), FRAMEWORKS)
async def test_web_apps_campaign_in_the_background_and_hand_over_at_shutdown(
    memory_elector: MakeMemory, make_app: MakeApp, serve: Serve
) -> None:
    served: list[str] = []
    a, b = memory_elector("a"), memory_elector("b")
    async with contextlib.AsyncExitStack() as both:
        url_b = await both.enter_async_context(serve(make_app(b, served)))
        async with serve(make_app(a, served)) as url_a:
            urls = [url_a, url_b]

            async def one_leader() -> list[dict[str, Any]]:
                deadline = time.monotonic() + 5
                while True:
                    bodies = await leaders(urls)
                    if [s["role"] for s in bodies].count("leader") == 1 or time.monotonic() > deadline:
                        return bodies
                    await asyncio.sleep(0.02)

            bodies = await one_leader()
            roles = sorted(s["role"] for s in bodies)
            assert roles == ["follower", "leader"], bodies
            leader = next(s for s in bodies if s["role"] == "leader")
            follower = next(s for s in bodies if s["role"] == "follower")
            assert leader["token"] is not None and follower["token"] is None
            assert leader["leader"] == follower["leader"] == leader["identity"]
            assert {s["identity"] for s in bodies} == {"a", "b"}
            # Both serve, the follower included.
            for url in urls:
                async with httpx.AsyncClient(timeout=5) as client:
                    assert (await client.get(url + "/hello")).text == "hello"
            assert sorted(served) == ["a", "b"]
            only = {url: (await get_json(url + "/leader-only"))[0] for url in urls}
            assert sorted(only.values()) == [200, 503]
            if leader["identity"] == "b":  # shut the leader down, whichever it is
                memory_elector().depose("test: make a lead")
                await wait_for(lambda: a.leading, what="a to lead")
        # a's application has shut down: its leadership released; its elector, given as such, stays open
        # (whoever built it closes it), so the application could start again. b leads.
        assert not a.leading
        await wait_for(lambda: b.leading, what="b to take over")
        with pytest.raises(TimeoutError):
            await a.acquire(timeout=0.1)  # open, campaigning behind b
        status, body = await get_json(url_b + "/leader")
        assert status == 200 and body["role"] == "leader" and body["leader"] == "b" and body["token"] is not None
    assert b.leading is False


@pytest.mark.parametrize(("make_app", "serve"), FRAMEWORKS)
async def test_web_status_of_a_failed_campaign_is_503(tmp_path: Path, make_app: MakeApp, serve: Serve) -> None:
    (tmp_path / "target").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    async with serve(make_app(FileElector(tmp_path / "link", identity="a"), [])) as url:
        deadline = time.monotonic() + 5
        while (result := await get_json(url + "/leader"))[1]["role"] != "failed" and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        status, body = result
        assert status == 503 and body["role"] == "failed" and "link" in body["error"]


# --- Kubernetes probes: HealthServer, `aioelect run --health-port`, the example manifest ----------------------

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "docs" / "recipes" / "kubernetes.yaml"


async def probe(url: str, method: str = "GET") -> tuple[int, dict[str, Any] | None]:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.request(method, url)
        return response.status_code, (response.json() if response.content else None)


async def test_health_server_probes_of_a_leader_and_a_follower(memory_elector: MakeMemory) -> None:
    a, b = memory_elector("a"), memory_elector("b")
    async with HealthServer(a) as health_a, HealthServer(b) as health_b:
        await health_a.start("127.0.0.1", 0)
        await health_b.start("127.0.0.1", 0)
        url_a, url_b = f"http://127.0.0.1:{health_a.port}", f"http://127.0.0.1:{health_b.port}"
        lead = await a.acquire()
        for url in (url_a, url_b):
            assert (await probe(url + "/healthz"))[0] == 200
            assert (await probe(url + "/readyz"))[0] == 200
        status, body = await probe(url_a + "/leader")
        assert status == 200 and body is not None
        assert body["role"] == "leader" and body["identity"] == "a" and body["token"] == lead.token
        status, body = await probe(url_b + "/readyz")
        assert status == 200 and body is not None and body["role"] == "follower" and body["leader"] == "a"
        assert body["token"] is None
        assert (await probe(url_b + "/leader"))[0] == 503
        # The backend fails: readiness fails, liveness does not (a restart would not help).
        a.fail()
        assert (await probe(url_b + "/readyz"))[0] == 503
        assert (await probe(url_b + "/healthz"))[0] == 200
        a.restore()
        assert (await probe(url_b + "/readyz"))[0] == 200
        # Plain HTTP rules, bounded answers.
        assert (await probe(url_a + "/nope"))[0] == 404
        assert (await probe(url_a + "/healthz", "POST"))[0] == 405
        assert await probe(url_a + "/leader", "HEAD") == (200, None)
        await lead.release()
        assert (await probe(url_a + "/leader"))[0] == 503
    with pytest.raises(httpx.ConnectError):
        await probe(url_a + "/healthz")


async def test_health_server_refuses_an_oversized_request(memory_elector: MakeMemory) -> None:
    async with HealthServer(memory_elector("a")) as health:
        await health.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", health.port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"x" * (MAX_REQUEST + 10) + b"\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 431 ")


async def test_health_server_resets_connections_beyond_its_cap_and_drops_slow_heads(
    memory_elector: MakeMemory,
) -> None:
    """Two idle connections fill a cap of 2: a third is reset at once; a probe answers once one is gone."""
    async with HealthServer(memory_elector("a"), max_connections=2) as health:
        await health.start()
        health.http.request_timeout = 1.0  # the idle ones get their 408 after a second
        idle = [await asyncio.open_connection("127.0.0.1", health.port) for _ in range(2)]
        await wait_for(lambda: health.http.open_connections == 2, what="both idle connections")
        reader, writer = await asyncio.open_connection("127.0.0.1", health.port)
        try:
            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.wait_for(reader.read(), 2) == b""  # closed unanswered
        finally:
            writer.close()
        assert health.http.refused == 1
        for idle_reader, idle_writer in idle:
            answer = await asyncio.wait_for(idle_reader.read(), 5)
            idle_writer.close()
            assert answer.startswith(b"HTTP/1.1 408 ")
        assert (await probe(f"http://127.0.0.1:{health.port}/healthz"))[0] == 200


async def test_health_server_with_a_failed_campaign_fails_liveness(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    campaign = Campaign(FileElector(tmp_path / "link", identity="a"))
    async with HealthServer(campaign.elector, campaign=campaign) as health:
        await health.start()
        await campaign.start()
        try:
            await wait_for(lambda: campaign.role == "failed", what="the campaign to fail")
            status, body = await probe(f"http://127.0.0.1:{health.port}/healthz")
            assert status == 503 and body is not None and body["role"] == "failed" and "link" in body["error"]
        finally:
            await campaign.stop()


async def test_a_leader_work_error_is_served_with_its_type_and_redacted(
    memory_elector: MakeMemory, caplog: pytest.LogCaptureFixture
) -> None:
    """Leader work that fails with a DSN in its message: /leader and the log show the type, never the password."""
    secret = "Sup3rS3cret"

    async def work(lead: aioelect.Leadership) -> None:
        raise RuntimeError(f"could not connect to postgresql://report:{secret}@db.example:5432/reports")

    campaign = Campaign(memory_elector("a"), work)
    async with HealthServer(campaign.elector, campaign=campaign) as health:
        await health.start()
        await campaign.start()
        try:
            await wait_for(lambda: campaign.role == "failed", what="the campaign to fail")
            for path in PATHS:
                status, body = await probe(f"http://127.0.0.1:{health.port}{path}")
                assert status == 503 and body is not None and body["role"] == "failed"
                assert (
                    body["error"]
                    == "RuntimeError: could not connect to postgresql://report:***@db.example:5432/reports"
                )
            assert secret not in ((await campaign.status()).error or "")
        finally:
            await campaign.stop()
    assert "RuntimeError" in caplog.text and secret not in caplog.text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start_cli_run(lock: Path, identity: str, port: int) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOELECT_")}
    env["PYTHONPATH"] = str(ROOT)
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aioelect", "run", "--file", str(lock), "--identity", identity, "--forever",
        "--health-port", str(port), "--", sys.executable, "-c", "import time; time.sleep(60)",
        env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def wait_for_probe(url: str, code: int, timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            status, body = await probe(url)
            if status == code and body is not None:
                return body
            last = (status, body)
        except httpx.TransportError as exc:
            last = exc
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not answer {code} within {timeout}s; last: {last!r}")


async def stop_process(process: asyncio.subprocess.Process) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    try:
        return await asyncio.wait_for(process.wait(), 15)
    except TimeoutError:
        process.kill()
        return await process.wait()


async def test_cli_run_serves_probes_and_the_follower_takes_over(tmp_path: Path) -> None:
    """Two `aioelect run --forever --health-port` processes on one lock file: one leads, both are alive and
    ready, /leader tells them apart; the leader stops (SIGTERM) and the follower's /leader turns 200."""
    lock = tmp_path / "run.lock"
    port_a, port_b = free_port(), free_port()
    a = await start_cli_run(lock, "a", port_a)
    b: asyncio.subprocess.Process | None = None
    try:
        body = await wait_for_probe(f"http://127.0.0.1:{port_a}/leader", 200)
        assert body["identity"] == "a" and body["role"] == "leader" and body["token"] is not None
        b = await start_cli_run(lock, "b", port_b)
        for path in ("/healthz", "/readyz"):
            await wait_for_probe(f"http://127.0.0.1:{port_b}{path}", 200)
        body = await wait_for_probe(f"http://127.0.0.1:{port_b}/leader", 503)
        assert body["role"] == "follower" and body["leader"] == "a"
        assert await stop_process(a) == 128 + signal.SIGTERM  # CMD died of the SIGTERM forwarded to it
        body = await wait_for_probe(f"http://127.0.0.1:{port_b}/leader", 200)
        assert body["identity"] == "b" and body["token"] is not None
    finally:
        for process in (a, b):
            if process is not None:
                await stop_process(process)
    with pytest.raises(httpx.ConnectError):
        await probe(f"http://127.0.0.1:{port_b}/healthz")


def test_kubernetes_manifest_parses_and_its_probes_match_the_cli() -> None:
    docs = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    kinds = {doc["kind"]: doc for doc in docs}
    assert {"Deployment", "Secret"} <= set(kinds)
    deployment = kinds["Deployment"]
    assert deployment["spec"]["replicas"] == 3
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    argv = [*container.get("command", []), *container.get("args", [])]
    assert argv[:2] == ["aioelect", "run"]
    # The real parser accepts the command line, and reads the probes' port and host from it.
    ours, cmd = split_command(argv[1:])
    args = build_parser().main.parse_args(ours)
    assert args.command == "run" and args.forever and cmd, argv
    assert args.health_port is not None and args.health_host == "0.0.0.0"
    env = {item["name"]: item for item in container["env"]}
    assert env["AIOELECT_NAME"]["value"]
    dsn = next(item for name, item in env.items() if name.endswith("_DSN"))
    secret = dsn["valueFrom"]["secretKeyRef"]
    assert secret["name"] == kinds["Secret"]["metadata"]["name"]
    assert secret["key"] in kinds["Secret"].get("stringData", {}) | kinds["Secret"].get("data", {})
    # The command line reads the backend from that environment (the Secret's values put in).
    environ = {
        name: item["value"]
        if "value" in item
        else kinds["Secret"]["stringData"][item["valueFrom"]["secretKeyRef"]["key"]]
        for name, item in env.items()
        if "value" in item or "secretKeyRef" in item.get("valueFrom", {})
    }
    config = configure(args, Settings.from_environ(environ))
    assert config.kind in ("mysql", "postgres", "etcd") and "replace-me" not in config.where
    # A rolling update moves leadership once: every pod has a priority, and handover notes have their schema.
    assert priority_from(environ.get("AIOELECT_PRIORITY")) is not None
    assert config.kind != "postgres" or environ.get("AIOELECT_SCHEMA")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for kind, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[kind]["httpGet"]
        assert get["path"] == path and path in PATHS
        assert get["port"] in (args.health_port, *(name for name, port in ports.items() if port == args.health_port))


def test_frameworks_load_only_with_their_own_module() -> None:
    """``import aioelect``, ``aioelect.integrations`` and the command line load no framework."""
    code = (
        "import sys, aioelect, aioelect.integrations, aioelect.integrations.health, aioelect.cli\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('apscheduler', 'starlette', 'aiohttp', 'fastapi', 'uvicorn', 'httpx')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _lower_fd_limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))


def _flood(port: int, count: int) -> list[socket.socket]:
    """``count`` connections to ``port`` that send part of a request head and never finish it."""
    opened = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", port))
        opened.append(sock)
    return opened


def _descriptors_and_threads(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
    return len(os.listdir(f"/proc/{pid}/fd")), threads


async def test_probes_that_never_finish_cannot_starve_the_election(tmp_path: Path) -> None:
    """``ulimit -n 128``, 400 probe and 300 metrics connections that never finish their heads: the leader leads on.

    Each server holds at most its cap of connections (an eighth of the
    limit) and resets the rest, so the supervisor keeps most descriptors
    free and runs no thread per connection; accept failures are logged a
    few times, not once per attempt; the probes answer again once the
    flood ends.
    """
    lock, port, metrics_port = tmp_path / "lock", free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOELECT_")}
    env["PYTHONPATH"] = str(ROOT)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aioelect", "run", "--file", str(lock), "--identity", "a", "--forever",
        "--health-port", str(port), "--metrics-port", str(metrics_port),
        "--", sys.executable, "-c", "import time; time.sleep(60)",
        env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, preexec_fn=_lower_fd_limit,
    )  # fmt: skip
    assert process.stderr is not None
    errors = asyncio.create_task(process.stderr.read())  # read all along: a full pipe would block the supervisor
    url = f"http://127.0.0.1:{port}"
    flood: list[socket.socket] = []
    try:
        await wait_for_probe(url + "/leader", 200)
        flood = _flood(port, 400) + _flood(metrics_port, 300)
        await asyncio.sleep(0.5)
        for sock in flood:
            with contextlib.suppress(OSError):
                sock.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never the blank line that ends the head
        most_fds = most_threads = 0
        for _ in range(35):  # 7 s: longer than the request timeout, so slow heads are dropped while the flood goes on
            fds, threads = _descriptors_and_threads(process.pid)
            most_fds, most_threads = max(most_fds, fds), max(most_threads, threads)
            await asyncio.sleep(0.2)
        print(f"under the flood: at most {most_fds} descriptors of 128, {most_threads} threads")
        assert process.returncode is None, "the supervisor died under the flood"
        assert most_fds <= 80 and most_threads <= 10, (most_fds, most_threads)
        for sock in flood:
            sock.close()
        flood.clear()
        body = await wait_for_probe(url + "/leader", 200, timeout=10)
        assert body["identity"] == "a" and body["role"] == "leader"
        async with httpx.AsyncClient(timeout=5) as client:
            page = await client.get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert page.status_code == 200 and 'aioelect_is_leader{backend="file",name="aioelect/leader"} 1.0' in page.text
    finally:
        for sock in flood:
            sock.close()
        await stop_process(process)
        stderr = (await asyncio.wait_for(errors, 10)).decode(errors="replace")
    assert "leadership lost" not in stderr and "interrupted" not in stderr, stderr[-3000:]
    assert stderr.count("Traceback") == 0 and len(stderr.splitlines()) < 40, stderr[-3000:]


#: A program that serves an empty registry with PrometheusMetrics.serve() and prints the port it listens on.
SERVE_METRICS = """\
import sys, time
import prometheus_client
from aioelect.metrics import PrometheusMetrics
registry = prometheus_client.CollectorRegistry()
prometheus_client.Counter("flood_test", "a series to find on the page", registry=registry).inc()
PrometheusMetrics(registry).serve(int(sys.argv[1]))
print("serving", flush=True)
time.sleep(60)
"""


async def test_metrics_serve_holds_idle_connections_to_its_cap_and_answers_after_them() -> None:
    """300 connections that never finish their heads: ``PrometheusMetrics.serve()`` grows no thread and holds at
    most its connection cap (32) of descriptors; /metrics answers once they are gone."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVE_METRICS, str(port), env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    flood: list[socket.socket] = []
    try:
        assert await asyncio.wait_for(process.stdout.readline(), 30) == b"serving\n"
        fds_before, threads_before = _descriptors_and_threads(process.pid)
        flood = _flood(port, 300)
        await asyncio.sleep(0.5)
        for sock in flood:
            with contextlib.suppress(OSError):
                sock.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never the blank line that ends the head
        most_fds = most_threads = 0
        for _ in range(10):
            fds, threads = _descriptors_and_threads(process.pid)
            most_fds, most_threads = max(most_fds, fds), max(most_threads, threads)
            await asyncio.sleep(0.2)
        print(f"before: {fds_before} descriptors, {threads_before} threads; under 300 idle connections: at most "
              f"{most_fds} descriptors, {most_threads} threads")  # fmt: skip
        assert process.returncode is None, "the metrics server's process died under the flood"
        assert most_threads <= threads_before and most_fds <= fds_before + 32 + 1, (most_fds, most_threads)
        for sock in flood:
            sock.close()
        flood.clear()
        async with httpx.AsyncClient(timeout=5) as client:
            for _ in range(50):  # the reset connections' slots free at once; a slow head's within 5 s
                with contextlib.suppress(httpx.TransportError):
                    page = await client.get(f"http://127.0.0.1:{port}/metrics")
                    break
                await asyncio.sleep(0.1)
        assert page.status_code == 200 and "flood_test_total 1.0" in page.text, page.text[:500]
    finally:
        for sock in flood:
            sock.close()
        process.kill()
        await process.wait()
