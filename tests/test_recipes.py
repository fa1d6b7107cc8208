"""The recipes run as users start them, keep one leader for their whole run, and hand over when it stops.

Each recipe is a complete file under ``examples/recipes/`` that its page
includes as it is (mkdocs snippets). Two instances of it start the way the
page says (``uvicorn module:app``, ``python web_aiohttp.py`` with
``web.run_app``, ``python scheduler_apscheduler.py``), configured only
through ``AIOELECT_*`` variables, on a lock file and on the harness's
MariaDB (and PostgreSQL for the leader-only jobs). The test watches
them for a few seconds: exactly one leads, with one fencing token, the
whole time; then the leader is stopped with SIGTERM and the other leads
with a larger token.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_docs import ROOT, WAIT, Program, file_case, mysql_case, postgres_case, programs  # noqa: F401 (fixture)

RECIPES = ROOT / "examples" / "recipes"
#: How long the two instances are watched keeping one leader, before and after the handover (a job runs every
#: second: two runs at least, with room for a loaded machine).
STEADY = 3.0
WEB = {
    "starlette": "web_starlette",
    "fastapi": "web_fastapi",
    "aiohttp": "web_aiohttp",
}


@pytest.fixture(params=["file", "mysql"])
def backend_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    if request.param == "file":
        return file_case(tmp_path)[0]
    if request.param == "postgres":
        return postgres_case(request.getfixturevalue("postgres_dsn"))[0]
    return mysql_case(request.getfixturevalue("mysql_dsn"))[0]


def handovers(cases: list[str], on_postgres: str | None = None) -> list[Any]:
    """Each case on a lock file and MariaDB, and ``on_postgres`` on PostgreSQL too (a few seconds more)."""
    return [
        pytest.param(backend, case, id=f"{backend}-{case}")
        for case in cases
        for backend in ("file", "mysql", *(("postgres",) if case == on_postgres else ()))
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class WebInstance:
    def __init__(self, framework: str, env: dict[str, str], started: list[Program]) -> None:
        self.port = free_port()
        module = WEB[framework]
        if framework == "aiohttp":
            argv = [sys.executable, "-u", f"{module}.py"]  # web.run_app, as the recipe says
        else:
            argv = [sys.executable, "-m", "uvicorn", f"{module}:app", "--host", "127.0.0.1", "--port", str(self.port)]
        self.program = Program("", {**env, "PORT": str(self.port)}, RECIPES, argv)
        started.append(self.program)
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> httpx.Response | None:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(self.url + path, timeout=2)
        return None

    def status(self) -> dict[str, Any] | None:
        answer = self.get("/leader")
        return None if answer is None else dict(answer.json())


def wait_until(what: str, condition: Callable[[], Any], started: list[Program], timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    output = "\n---\n".join(p.text() + "\n" + "\n".join(p.lines_now()) for p in started)
    raise AssertionError(f"{what} within {timeout} s; output:\n{output}")


def one_leader(instances: list[WebInstance]) -> tuple[WebInstance, int] | None:
    """The instance that leads and its token when exactly one instance says it leads, else None."""
    statuses = [instance.status() for instance in instances]
    leading = [(i, s) for i, s in zip(instances, statuses, strict=True) if s is not None and s["role"] == "leader"]
    if len(leading) != 1 or any(s is None for s in statuses):
        return None
    instance, status = leading[0]
    return instance, int(status["token"])


def hold_steady(instances: list[WebInstance], leader: WebInstance, token: int) -> None:
    """For STEADY seconds: the same single leader with the same token, the other a follower that knows it."""
    identity = leader.status()["identity"]  # type: ignore[index]
    until = time.monotonic() + STEADY
    while time.monotonic() < until:
        for instance in instances:
            status = instance.status()
            assert status is not None, f"{instance.url} stopped answering"
            if instance is leader:
                assert (status["role"], status["token"]) == ("leader", token), (
                    f"the leader must keep leading with token {token}: {status}"
                )
            else:
                assert status["role"] == "follower", status
        time.sleep(0.2)
    for instance in instances:
        if instance is not leader:
            assert instance.status()["leader"] == identity  # type: ignore[index]


def check_leader_only_routes(framework: str, leader: WebInstance, follower: WebInstance, token: int) -> None:
    if framework == "starlette":
        pairs = [(leader.get("/leader-only"), 200), (follower.get("/leader-only"), 503)]
    else:
        pairs = [
            (httpx.post(leader.url + "/reindex", timeout=2), 200),
            (httpx.post(follower.url + "/reindex", timeout=2), 503),
        ]
    for answer, code in pairs:
        assert answer is not None and answer.status_code == code, (answer, answer and answer.text)
    if framework != "starlette":
        assert pairs[0][0].json() == {"reindexed": True, "token": token}  # type: ignore[union-attr]
    if framework == "fastapi":
        assert leader.get("/role").json() == {"leading": True, "token": token}  # type: ignore[union-attr]
        assert follower.get("/role").json() == {"leading": False, "token": None}  # type: ignore[union-attr]


def stopped(program: Program) -> None:
    """``program`` ended its run on SIGTERM cleanly: released its leadership, no traceback."""
    code = program.wait()
    # uvicorn ends by raising the signal it handled again, after its shutdown; aioelect.run() with 128 + SIGTERM.
    assert code in (0, -signal.SIGTERM, 128 + signal.SIGTERM), f"exit status {code}:\n{program.text()}"
    assert "Traceback" not in program.text() and "leadership released" in program.text(), program.text()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("backend_env", "framework"), handovers(list(WEB)), indirect=["backend_env"])
def test_web_recipe_keeps_one_leader_and_hands_over(
    framework: str,
    backend_env: dict[str, str],
    programs: list[Program],  # noqa: F811
) -> None:
    instances = [WebInstance(framework, backend_env, programs) for _ in range(2)]
    leader, token = wait_until("one instance leads", lambda: one_leader(instances), programs)
    hold_steady(instances, leader, token)
    (follower,) = [instance for instance in instances if instance is not leader]
    check_leader_only_routes(framework, leader, follower, token)

    leader.program.proc.send_signal(signal.SIGTERM)  # a graceful stop, as a deployment does
    stopped(leader.program)
    new_leader, new_token = wait_until("the other instance leads", lambda: one_leader([follower]), programs)
    assert new_leader is follower and new_token > token
    hold_steady([follower], follower, new_token)


#: Every file of examples/recipes/ a test here starts.
#: The recipes whose jobs run every second on the leader, each with the line a run prints.
JOBS = {
    "scheduler_apscheduler.py": re.compile(r"cache refreshed with token (\d+)"),
    "leader_only_jobs.py": re.compile(r"digest sent with token (\d+)"),
}
RECIPE_FILES = [
    *(f"{module}.py" for module in WEB.values()),
    *JOBS,
    "celery_beat_app.py",
    "django_site/reports/management/commands/send_digest.py",
]


def one_runner_then_another(instances: list[Program], run_line: re.Pattern[str]) -> None:
    """Only one instance prints ``run_line`` (under one token, when the line shows one) until it gets SIGTERM;
    then only the other one does (under a larger token)."""

    def runs() -> list[tuple[int, int]]:
        """(instance, token) of each run printed since the last look (token 0 when the line shows none)."""
        return [
            (index, int(found.group(1)) if run_line.groups else 0)
            for index, program in enumerate(instances)
            for line in program.lines_now()
            if (found := run_line.search(line))
        ]

    first = wait_until("a job runs", runs, instances)
    leader, token = first[0]
    assert all(run == (leader, token) for run in first), first
    time.sleep(STEADY)
    steady = runs()
    assert len(steady) >= 2, "the leader's job runs every second"
    assert set(steady) == {(leader, token)}, f"only the leader runs the job, under one token: {steady}"

    instances[leader].proc.send_signal(signal.SIGTERM)
    code = instances[leader].wait()
    assert code in (0, 128 + signal.SIGTERM), f"exit status {code}:\n{instances[leader].text()}"
    after = wait_until("the other instance runs the job", runs, instances)
    other = 1 - leader
    assert {index for index, _ in after} == {other}, after
    if run_line.groups:
        assert all(t > token for _, t in after), after
    assert "Traceback" not in "\n".join(p.text() for p in instances)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("backend_env", "recipe"), handovers(list(JOBS), "leader_only_jobs.py"), indirect=["backend_env"]
)
def test_job_recipe_keeps_one_leader_and_hands_over(
    recipe: str,
    backend_env: dict[str, str],
    programs: list[Program],  # noqa: F811
) -> None:
    instances = [Program("", backend_env, RECIPES, [sys.executable, "-u", recipe]) for _ in range(2)]
    programs.extend(instances)
    one_runner_then_another(instances, JOBS[recipe])
    for program in instances:
        if program.proc.poll() is not None:
            assert "leadership released" in program.text(), program.text()


def aioelect_run(*options: str) -> list[str]:
    """``aioelect run OPTIONS`` as the recipes print it (the command line of the package under test)."""
    return [sys.executable, "-m", "aioelect", "run", *options]


def with_venv_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this interpreter's directory first on PATH, where ``celery`` and ``python`` are installed."""
    return {**env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])}


@pytest.mark.timeout(180)
def test_celery_beat_under_aioelect_run_forever_keeps_one_beat(
    backend_env: dict[str, str],
    programs: list[Program],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Two hosts run ``aioelect run --forever -- celery -A celery_beat_app beat``: one beat sends, then the other."""
    broker = tmp_path / "broker"
    broker.mkdir()
    env = with_venv_path({**backend_env, "CELERY_BROKER_URL": "filesystem://", "CELERY_BROKER_DIR": str(broker)})
    instances = [
        Program(
            "",
            env,
            RECIPES,
            aioelect_run(
                "--forever", "--", "celery", "-A", "celery_beat_app", "beat",
                "--schedule", str(tmp_path / f"schedule-{index}"), "--loglevel", "INFO",
            ),
        )
        for index in range(2)
    ]  # fmt: skip
    programs.extend(instances)
    one_runner_then_another(instances, re.compile(r"Sending due task refresh-cache"))
    sent = sum(program.text().count("Sending due task refresh-cache") for program in instances)
    wait_until("every task beat sent to be in the broker", lambda: len(list(broker.iterdir())) >= sent, instances, 10)


@pytest.mark.timeout(180)
def test_django_command_under_aioelect_run_no_wait_runs_on_the_leader_only(
    backend_env: dict[str, str],
    programs: list[Program],  # noqa: F811
) -> None:
    """Cron on two hosts starts ``aioelect run --no-wait --conflict-exit-code 0 -- python manage.py send_digest``."""
    site = RECIPES / "django_site"
    env = with_venv_path(backend_env)
    command = [*aioelect_run("--no-wait", "--conflict-exit-code", "0", "--"), "python", "manage.py", "send_digest"]
    holder = Program("", env, site, [*command, "--seconds", "60"])
    programs.append(holder)
    token = int(holder.expect(r"sending the digest with token (\d+)").group(1))

    for conflict in ([], ["--conflict-exit-code", "0"]):
        other = subprocess.run(
            [*aioelect_run("--no-wait", *conflict, "--"), "python", "manage.py", "send_digest"],
            cwd=site, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert other.returncode == (0 if conflict else 75), other.stderr
        assert "digest" not in other.stdout and "another instance leads" in other.stderr, other

    holder.proc.send_signal(signal.SIGTERM)
    holder.wait()
    after = subprocess.run(command, cwd=site, env=env, capture_output=True, text=True, timeout=60)
    assert after.returncode == 0, after.stderr
    sent = re.search(r"digest sent with token (\d+)", after.stdout)
    assert sent and int(sent.group(1)) > token, after.stdout


# --- In one process: what a test suite of the application does -------------------------------------------------


def import_recipe(name: str) -> Any:
    """The recipe module ``examples/recipes/{name}.py``, imported as a test suite would import the application."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def leader_status(client: Any) -> dict[str, Any]:
    """The /leader answer once this sole instance leads (the campaign runs in the background)."""
    deadline = time.monotonic() + 10
    while True:
        status: dict[str, Any] = client.get("/leader").json()
        if status["role"] != "follower" or time.monotonic() > deadline:
            return status
        time.sleep(0.02)


def test_an_application_given_an_elector_starts_twice_in_one_process() -> None:
    """Each TestClient(app) runs the lifespan: the second start must lead again, not find its elector closed."""
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from aioelect.integrations.asgi import election_lifespan, status_route
    from aioelect.testing import MemoryElector

    elector = MemoryElector(name="recipes/twice")
    app = Starlette(lifespan=election_lifespan(elector), routes=[status_route("/leader")])
    for start in range(2):
        with TestClient(app) as client:
            status = leader_status(client)
            assert (status["role"], status["error"]) == ("leader", None), f"start {start}: {status}"


@pytest.mark.parametrize("recipe", ["web_starlette", "web_fastapi"])
def test_asgi_recipes_start_twice_in_one_process(recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from starlette.testclient import TestClient

    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("AIOELECT_FILE", str(directory / "leader.lock"))
    app = import_recipe(recipe).app
    tokens = []
    for _ in range(2):
        with TestClient(app) as client:
            status = leader_status(client)
            assert (status["role"], status["error"]) == ("leader", None), status
            tokens.append(status["token"])
    assert tokens[1] > tokens[0], tokens


async def test_apscheduler_recipe_jobs_run_under_a_leadership(memory_elector: Callable[..., Any]) -> None:
    """The recipe's jobs run as printed: write_report exists and takes the token by the name the job passes."""
    recipe = import_recipe("scheduler_apscheduler")
    async with memory_elector() as elector:
        assert await elector.run(recipe.nightly_report) is None
        assert await elector.run(recipe.refresh_cache) is None


def test_apscheduler_recipe_lets_a_run_due_during_a_handover_run_on_the_new_leader() -> None:
    """Every job's misfire_grace_time is longer than the slowest failover (a lease of 10 s, an etcd TTL of 5 s)."""
    scheduler = import_recipe("scheduler_apscheduler").build_scheduler()
    jobs = scheduler.get_jobs()
    assert {job.id for job in jobs} == {"nightly-report", "refresh-cache"}
    for job in jobs:
        assert job.coalesce and job.misfire_grace_time is not None and job.misfire_grace_time >= 60, job


def test_the_apscheduler_module_example_passes_the_token_as_the_recipe_does() -> None:
    import aioelect.integrations.apscheduler as module

    calls = re.findall(r"write_report\((\w+)=", module.__doc__ or "")
    assert calls == ["fencing_token"], calls
    assert "fencing_token" in import_recipe("scheduler_apscheduler").write_report.__code__.co_varnames
