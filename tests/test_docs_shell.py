"""The docs' shell blocks: every command of aioelect's own a page tells users to type runs here, as printed.

Every ```sh (```bash, ```console) block of README.md and docs/ stands right
under a marker:

* ``<!-- docs-test: shell -->``: a one-host setup, run by tests/test_docs.py
  before the leader loop of its page;
* ``<!-- docs-test: shell-runs NAME -->``: run here by the test of that name:
  each command as printed, in bash, with only the page's addresses (a DSN's
  host ``db``, a lock file under /run, a port) put on the test servers and
  a private directory, its exit status and output checked (the Redis
  Sentinel page starts its own servers: there only its ports change, to
  free ones, and its home directory is a private one);
* ``<!-- docs-test: shell-skip: REASON -->``: not run, for the reason given
  (it installs packages, needs Docker, runs for minutes, or another test
  runs it).

``./report.sh`` and ``celery`` are the user's programs: here, small scripts
that print their arguments and the fencing token aioelect gives them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from .test_docs import DOCUMENTS, ROOT, Program, base_env, programs  # noqa: F401 (fixture)

FENCE = re.compile(r"^( *)```(sh|bash|console|shell)\n", re.M)
SHELL_MARKER = re.compile(r"<!-- docs-test: (shell|shell-runs [a-z-]+|shell-skip: \S[^\n]*?) -->")
PAGES = (*DOCUMENTS, *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "recipes").glob("*.md")))
#: The tests that run each ``shell-runs`` block, by the block's name.
RUNS = (
    "command-line",
    "metrics",
    "exports",
    "run-forms",
    *(f"sentinel-{step}" for step in ("servers", "sentinels", "start", "elect", "failover", "stop")),
)
#: `make -n` as a top-level make prints it: the plan only, with no "Entering directory" lines, also when this
#: test runs under `make test` (whose MAKELEVEL and MAKEFLAGS a child make would otherwise inherit).
MAKE_N = ("make", "--no-print-directory", "-n")
MAKE_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}

REPORT = """\
#!/bin/sh
echo report "$@" token "$AIOELECT_TOKEN"
sleep "${REPORT_SECONDS:-0}"
"""
CELERY = """\
#!/bin/sh
echo celery "$@" token "$AIOELECT_TOKEN"
exec sleep 600
"""


def shell_blocks(page: str) -> list[tuple[str, str]]:
    """(marker, commands) of each shell block of ``page``; the marker is "" where there is none."""
    text = (ROOT / page).read_text()
    blocks: list[tuple[str, str]] = []
    for fence in FENCE.finditer(text):
        indent = fence.group(1)
        end = text.index(f"\n{indent}```", fence.end() - 1)
        body = "\n".join(line[len(indent) :] for line in text[fence.end() : end].splitlines())
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        marker = SHELL_MARKER.fullmatch(before)
        blocks.append((marker.group(1) if marker else "", body))
    return blocks


def block(name: str) -> str:
    (found,) = [body for page in PAGES for marker, body in shell_blocks(page) if marker == f"shell-runs {name}"]
    return found


def commands(body: str) -> list[str]:
    """The block's commands, one per line (continuations joined), comments and blank lines left out."""
    joined = body.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_every_shell_block_runs_or_says_why_not() -> None:
    names: list[str] = []
    for page in PAGES:
        for marker, body in shell_blocks(page):
            assert marker, (
                f"{page}: a shell block without <!-- docs-test: shell-runs NAME / shell-skip: REASON -->:\n{body}"
            )
            if marker.startswith("shell-runs "):
                names.append(marker.split()[1])
    assert sorted(names) == sorted(RUNS), names


@pytest.fixture
def user(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment and the directory a user types the commands in: ``./report.sh`` there, ``celery`` and
    ``aioelect`` on the PATH."""
    home = tmp_path / "work"
    (home / "bin").mkdir(parents=True)
    for path, text in ((home / "report.sh", REPORT), (home / "bin" / "celery", CELERY)):
        path.write_text(text)
        path.chmod(0o755)
    env = base_env()
    env["PATH"] = ":".join([str(home / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")])
    return env, home


def bash(command: str, env: dict[str, str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def start(command: str, env: dict[str, str], cwd: Path, started: list[Program]) -> Program:
    program = Program("", env, cwd, ["bash", "-c", f"exec {command}"])
    started.append(program)
    return program


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def private_directory(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    return path


TOKEN = r"token [1-9]\d*"


@pytest.mark.timeout(120)
def test_the_command_line_examples(
    user: tuple[dict[str, str], Path],
    mysql_dsn: str,
    etcd_endpoints: list[str],
    programs: list[Program],  # noqa: F811
    tmp_path: Path,
) -> None:
    """docs/operations.md's first block: run, run --no-wait, run --forever, leader, observe --json."""
    env, home = user
    lock_dir = private_directory(tmp_path / "run" / "lock")
    beat_dir = private_directory(tmp_path / "run" / "beat")
    body = block("command-line")
    for printed, used in (
        ("mysql://app@db:3306/app", mysql_dsn),
        ("/run/beat/beat.lock", str(beat_dir / "beat.lock")),
        ("/run/lock/report.lock", str(lock_dir / "report.lock")),
        ("10.0.0.1:2379,10.0.0.2:2379", ",".join(etcd_endpoints)),
        ("--name nightly-report", f"--name nightly-report-{uuid.uuid4().hex[:8]}"),
    ):
        assert printed in body, f"docs/operations.md no longer shows {printed}"
        body = body.replace(printed, used)
    run, no_wait, forever, leader, observe = commands(body)

    beat = start(forever, env, home, programs)  # the long-running ones, while the others run
    watcher = start(observe, env, home, programs)
    for command in (run, no_wait):
        done = bash(command, env, home)
        assert done.returncode == 0, done.stderr
        assert re.fullmatch(rf"report --full {TOKEN}\n", done.stdout), done.stdout
    nobody = bash(leader, env, home)
    assert (nobody.returncode, nobody.stdout) == (1, ""), nobody  # "exit 1 if nobody"

    beat.expect(rf"^celery -A app beat {TOKEN}$")
    first = json.loads(watcher.expect(r"^\{").string)
    assert first["leader"] is None, first  # nobody holds report.lock
    watcher.proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert watcher.wait() == 0, watcher.text()
    beat.proc.send_signal(signal.SIGTERM)  # forwarded to celery, whose status aioelect exits with
    assert beat.wait() == 128 + signal.SIGTERM, beat.text()


@pytest.mark.timeout(120)
def test_the_metrics_example(
    user: tuple[dict[str, str], Path],
    programs: list[Program],  # noqa: F811
    tmp_path: Path,
) -> None:
    """docs/operations.md's metrics: the command in the background, then curl shows the line the page shows."""
    env, home = user
    lock_dir = private_directory(tmp_path / "run" / "lock")
    port = free_port()
    body = block("metrics").replace("/run/lock/report.lock", str(lock_dir / "report.lock"))
    body = body.replace("9464", str(port))
    background, curl = commands(body)
    shown = body.splitlines()[-1].removeprefix("# ")
    assert background.endswith(" &")
    command = start(background.removesuffix(" &"), {**env, "REPORT_SECONDS": "60"}, home, programs)
    command.expect(rf"^report {TOKEN}$")
    deadline = time.monotonic() + 30
    while True:  # the page's curl follows the command at once; here it waits for the port to answer
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, command.text()
            time.sleep(0.1)
    done = bash(curl, env, home)
    assert done.returncode == 0 and done.stdout == shown + "\n", (done.stdout, shown)


@pytest.mark.timeout(120)
def test_the_quickstart_exports_and_run_forms(
    user: tuple[dict[str, str], Path],
    mysql_dsn: str,
    programs: list[Program],  # noqa: F811
) -> None:
    """docs/quickstart.md: the two exports configure the command; then its three forms of `aioelect run`."""
    env, home = user
    exports = block("exports")
    printed = "'mysql://app:secret@db:3306/app'"
    assert printed in exports
    exports = exports.replace(printed, f"'{mysql_dsn}'").replace(
        "AIOELECT_NAME=billing/invoice-cron", f"AIOELECT_NAME=billing/invoice-cron-{uuid.uuid4().hex[:8]}"
    )
    run, no_wait, forever = commands(block("run-forms"))
    # The forms, each in a shell that typed the exports first.
    beat = start(f"bash -c {shell_quote(exports + chr(10) + 'exec ' + forever)}", env, home, programs)
    beat.expect(rf"^celery -A app beat {TOKEN}$")
    busy = bash(f"{exports}\n{no_wait}", env, home)
    assert busy.returncode == 75 and "report" not in busy.stdout, busy  # "exit 75 at once if another leads"
    beat.proc.send_signal(signal.SIGTERM)
    assert beat.wait() == 128 + signal.SIGTERM, beat.text()
    for command in (run, no_wait):
        done = bash(f"{exports}\n{command}", env, home)
        assert done.returncode == 0, done.stderr
        assert re.fullmatch(rf"report --full {TOKEN}\n", done.stdout), done.stdout


def shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_make_demo_runs_the_demo_as_tests_test_demo_does() -> None:
    """Each `make demo [BACKEND=...]` the pages show (not run here: it builds a venv) runs examples/demo.py with
    the backend that tests/test_demo.py runs it with (`make -n` prints the commands without running them)."""
    demo_tests = (ROOT / "tests" / "test_demo.py").read_text()
    shown = {
        command.split("#")[0].strip()
        for page in PAGES
        for _, body in shell_blocks(page)
        for command in commands(body)
        if command.startswith("make demo")
    }
    assert shown, "no page shows make demo"
    for command in sorted(shown):
        planned = subprocess.run(
            [*MAKE_N, *command.split()[1:]], cwd=ROOT, capture_output=True, text=True, timeout=30, env=MAKE_ENV
        )
        assert planned.returncode == 0, planned.stderr
        last = planned.stdout.strip().splitlines()[-1].split()
        assert last[:2] == [".venv/bin/python", "examples/demo.py"], (command, planned.stdout)
        if len(last) > 2:
            assert last[2] == "--backend" and f'"--backend", "{last[3]}"' in demo_tests, (command, last)
        else:
            assert "def test_make_demo_without_arguments_runs_to_the_end" in demo_tests


def test_the_long_runs_the_pages_show_take_their_options() -> None:
    """`make soak`, `make adversary` and `python -m soak...` as the pages show them (not run here: they run for
    minutes): each command, or the command make plans for it (`make -n`), is accepted by its program's own parser
    (`--help` appended: it parses every option before it, then exits 0 without running)."""
    planned: dict[str, list[str]] = {}
    for page in PAGES:
        for _, body in shell_blocks(page):
            for command in commands(body):
                words = command.split("#")[0].split()
                if words[:2] in (["make", "soak"], ["make", "adversary"]):
                    plan = subprocess.run(
                        [*MAKE_N, *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=30, env=MAKE_ENV
                    )
                    assert plan.returncode == 0, plan.stderr
                    words = plan.stdout.strip().splitlines()[-1].split()
                if words[:3] in ([".venv/bin/python", "-m", "soak"], [".venv/bin/python", "-m", "soak.adversary"]):
                    planned[command] = [sys.executable, *words[1:], "--help"]
    assert len(planned) >= 5, planned  # make soak twice, make adversary twice, python -m soak and soak.adversary
    parsing = {
        command: subprocess.Popen(argv, cwd=ROOT, env=base_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)
        for command, argv in planned.items()
    }  # fmt: skip
    for command, proc in parsing.items():
        _, errors = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{command}: {errors}"


#: The loopback ports docs/redis-sentinel.md gives its master, replica and sentinels.
SENTINEL_PORTS = ("26379", "26380", "26381", "6379", "6380")


def stop_started(directory: Path) -> None:
    """SIGKILL every server whose pid file the page's files put in ``directory`` and that still runs in it (a
    daemonized Redis works in its ``dir``, which the page puts under ``directory``)."""
    for pidfile in directory.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip())
            if Path(f"/proc/{pid}/cwd").resolve().is_relative_to(directory.resolve()):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(240)
def test_the_redis_sentinel_setup(user: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    """docs/redis-sentinel.md, followed in one terminal: the files, a master, a replica and three sentinels started
    from them (on free loopback ports instead of the page's), an election through the sentinels, a failover and
    an election on the new master with a larger token, then the servers stopped with the page's own command."""
    from .harness import MissingBinaryError, require_binary
    from .harness.plugin import server_unavailable

    try:
        for binary in ("redis-server", "redis-sentinel", "redis-cli"):
            require_binary(binary)
    except MissingBinaryError as exc:
        server_unavailable(str(exc))
    env, home = user
    env = {**env, "HOME": str(home)}
    ports = {printed: str(free_port()) for printed in SENTINEL_PORTS}
    steps = [block(f"sentinel-{step}") for step in ("servers", "sentinels", "start", "elect", "failover", "stop")]
    script = "set -e\n" + "\n".join(
        re.sub(r"\b(" + "|".join(SENTINEL_PORTS) + r")\b", lambda found: ports[found.group(1)], step) for step in steps
    )
    for printed in SENTINEL_PORTS:
        assert re.search(rf"\b{printed}\b", "\n".join(steps)), f"the page no longer names port {printed}"
    directory = home / "redis-ha"
    try:
        done = bash(script, env, home, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        tokens = [int(token) for token in re.findall(r"^leading with token (\d+)$", done.stdout, re.M)]
        assert tokens == [1, 2], done.stdout  # the page's figures: a new election, then the new master's grant
        deadline = time.monotonic() + 30
        while list(directory.glob("*.pid")):  # the page's stop command: each server removes its pid file
            assert time.monotonic() < deadline, sorted(p.name for p in directory.glob("*.pid"))
            time.sleep(0.2)
    finally:
        stop_started(directory)
