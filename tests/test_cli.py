"""The ``aioelect`` command, end to end: real processes against real servers.

Every process started here is killed at teardown, and every wait is bounded.
``run`` is exercised with a small command that appends ``identity pid token``
lines to a file while it runs, so the file shows who ran the command when.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from .harness import EtcdServer, MariaDBServer, TCPProxy, free_port

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("mysql", "etcd", "postgres", "redis", "file")

TICK = """\
import os, signal, sys, time
out, ident, token = sys.argv[1], os.environ["AIOELECT_IDENTITY"], os.environ["AIOELECT_TOKEN"] or "-"
def write(text):
    with open(out, "a") as fh:
        fh.write(f"{ident} {os.getpid()} {token} {text}\\n")
mode = sys.argv[2] if len(sys.argv) > 2 else ""
if mode == "stubborn":  # ignores SIGTERM, exits 3 on SIGINT
    signal.signal(signal.SIGTERM, lambda *a: write("TERM-ignored"))
    signal.signal(signal.SIGINT, lambda *a: (write("INT"), sys.exit(3)))
elif mode == "graceful":  # exits 10 + the signal number
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: (write(f"signal-{signum}"), sys.exit(10 + signum)))
write("start")
if mode == "once":
    sys.exit(0)
while True:
    write("tick")
    time.sleep(0.1)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOELECT_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def aioelect_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "aioelect", *args]


def cli(*args: str, timeout: float = 30.0, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m aioelect ARGS`` to completion (bounded)."""
    return subprocess.run(
        aioelect_argv(*args), capture_output=True, text=True, timeout=timeout, env=_env(**env), cwd=ROOT
    )


def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> float:
    """Poll ``predicate`` until true; return the seconds it took, or fail after ``timeout``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@dataclass
class Lines:
    """The file the test command appends ``identity pid token event`` lines to."""

    path: Path

    def rows(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        return [line.split() for line in self.path.read_text().splitlines() if line.strip()]

    def identities(self) -> set[str]:
        return {row[0] for row in self.rows()}

    def of(self, identity: str, event: str | None = None) -> list[list[str]]:
        return [row for row in self.rows() if row[0] == identity and (event is None or row[3] == event)]


class Spawner:
    """Starts ``aioelect`` processes; kills whatever is left at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[str]] = []
        self.script = tmp / "tick.py"
        self.script.write_text(TICK)

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        n = len(self.procs)
        proc = subprocess.Popen(
            aioelect_argv(*args),
            stdout=open(self.tmp / f"proc{n}.out", "w"),  # noqa: SIM115 - closed with the process
            stderr=open(self.tmp / f"proc{n}.err", "w"),  # noqa: SIM115
            text=True,
            env=_env(**env),
            cwd=ROOT,
        )
        self.procs.append(proc)
        return proc

    def run_cmd(self, *args: str, out: Path, mode: str = "", **env: str) -> subprocess.Popen[str]:
        """``aioelect run ARGS -- python tick.py OUT MODE``."""
        return self.start("run", *args, "--", sys.executable, str(self.script), str(out), mode, **env)

    def stderr(self, proc: subprocess.Popen[str]) -> str:
        return (self.tmp / f"proc{self.procs.index(proc)}.err").read_text()

    def stdout(self, proc: subprocess.Popen[str]) -> str:
        return (self.tmp / f"proc{self.procs.index(proc)}.out").read_text()

    def wait(self, proc: subprocess.Popen[str], timeout: float = 15.0) -> int:
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"aioelect did not exit within {timeout:g}s; stderr:\n{self.stderr(proc)}")

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


@dataclass
class Target:
    """One backend as the command line names it."""

    kind: str
    args: list[str]
    #: Options that make takeovers and polling quick for this backend.
    tuning: list[str]
    takeover_bound: float

    def with_name(self, name: str | None = None) -> list[str]:
        name = name or ("/cli-test/" if self.kind == "etcd" else "cli-test-") + secrets.token_hex(4)
        return [*self.args, "--name", name]


@pytest.fixture(params=BACKENDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    kind = request.param
    if kind == "mysql":
        dsn: str = request.getfixturevalue("mysql_dsn")
        return Target("mysql", ["--mysql", dsn], ["--poll-interval", "0.3"], 10.0)
    if kind == "etcd":
        endpoints: list[str] = request.getfixturevalue("etcd_endpoints")
        return Target("etcd", ["--etcd", ",".join(endpoints)], ["--ttl", "2"], 15.0)
    if kind == "postgres":
        pg: str = request.getfixturevalue("postgres_dsn")
        return Target("postgres", ["--postgres", pg], ["--poll-interval", "0.3"], 10.0)
    if kind == "redis":
        url: str = request.getfixturevalue("redis_url")
        return Target("redis", ["--redis", url], ["--lease", "5", "--poll-interval", "0.3"], 10.0)
    return Target("file", ["--file", str(tmp_path / "leader.lock")], ["--poll-interval", "0.05"], 10.0)


# --- run: exclusion, takeover, signals, status --------------------------------------------


def test_only_the_leader_runs_cmd_and_a_follower_takes_over_when_it_is_killed(
    target: Target, spawner: Spawner, tmp_path: Path
) -> None:
    lines = Lines(tmp_path / "ticks")
    backend = [*target.with_name(), *target.tuning]
    procs = {ident: spawner.run_cmd(*backend, "--identity", ident, out=lines.path) for ident in ("cand-a", "cand-b")}
    wait_until("one candidate to run the command", lambda: bool(lines.rows()), 30)
    time.sleep(1.5)
    assert len(lines.identities()) == 1, f"both candidates ran the command: {lines.identities()}"
    (first,) = lines.identities()
    second = next(ident for ident in procs if ident != first)
    shown = cli("leader", *backend)
    assert (shown.returncode, shown.stdout.strip()) == (0, first), shown.stderr

    first_cmd = int(lines.of(first, "start")[0][1])
    procs[first].kill()  # SIGKILL: no chance to clean up
    wait_until("the killed leader's command to die with it", lambda: not pid_alive(first_cmd), 5)
    took = wait_until(
        "the follower to start the command", lambda: bool(lines.of(second, "start")), target.takeover_bound
    )
    ticks_of_first = len(lines.of(first))
    time.sleep(0.5)
    assert len(lines.of(first)) == ticks_of_first, "the deposed leader's command still runs"
    tokens = [lines.of(ident, "start")[0][2] for ident in (first, second)]
    if "-" not in tokens:
        assert int(tokens[1]) > int(tokens[0]), f"fencing tokens must increase across leaders: {tokens}"
    assert cli("leader", *backend).stdout.strip() == second
    print(f"{target.kind}: takeover after SIGKILL in {took:.3f}s")

    procs[second].send_signal(signal.SIGTERM)
    assert spawner.wait(procs[second]) == 128 + signal.SIGTERM  # the command died of the forwarded SIGTERM
    assert cli("leader", *backend).returncode == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_and_the_exit_status_is_cmds(
    mysql_dsn: str, spawner: Spawner, tmp_path: Path, sig: signal.Signals
) -> None:
    lines = Lines(tmp_path / "ticks")
    proc = spawner.run_cmd("--mysql", mysql_dsn, "--name", f"sig-{secrets.token_hex(4)}", out=lines.path,
                           mode="graceful")  # fmt: skip
    wait_until("the command to start", lambda: bool(lines.rows()), 20)
    proc.send_signal(sig)
    assert spawner.wait(proc) == 10 + sig
    assert lines.of(lines.rows()[0][0], f"signal-{int(sig)}"), "the command did not receive the signal"


def test_exit_status_of_cmd_is_propagated(mysql_dsn: str) -> None:
    name = ["--mysql", mysql_dsn, "--name", f"status-{secrets.token_hex(4)}"]
    assert cli("run", *name, "--", sys.executable, "-c", "raise SystemExit(5)").returncode == 5
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert cli("run", *name, "--", sys.executable, "-c", killed).returncode == 128 + signal.SIGKILL
    missing = cli("run", *name, "--", "/no/such/command")
    assert missing.returncode == 127
    assert "not found" in missing.stderr


def test_lost_leadership_stops_cmd_with_sigterm_then_sigkill_and_forever_campaigns_again(
    mariadb: MariaDBServer, spawner: Spawner, tmp_path: Path
) -> None:
    lines = Lines(tmp_path / "ticks")
    name = f"loss-{secrets.token_hex(4)}"
    proc = spawner.run_cmd(
        "--mysql", mariadb.dsn, "--name", name, "--identity", "stubborn", "--grace", "1", "--forever",
        "--restart-delay", "0.2", out=lines.path, mode="stubborn",
    )  # fmt: skip
    wait_until("the command to start", lambda: bool(lines.of("stubborn", "start")), 20)
    first_pid, first_token = int(lines.of("stubborn", "start")[0][1]), int(lines.of("stubborn", "start")[0][2])

    holder = mariadb.query("SELECT IS_USED_LOCK(%s)", (name,), database="")[0][0]
    mariadb.query(f"KILL {int(holder)}", database="")  # the server takes the lock away
    wait_until("SIGTERM to reach the command", lambda: bool(lines.of("stubborn", "TERM-ignored")), 10)
    term_at = time.monotonic()
    wait_until("SIGKILL after the grace period", lambda: not pid_alive(first_pid), 10)
    grace = time.monotonic() - term_at
    assert 0.3 < grace < 5, f"SIGKILL came {grace:.2f}s after SIGTERM; --grace is 1s"
    assert "leadership lost" in spawner.stderr(proc)

    restarted = lambda: len(lines.of("stubborn", "start")) > 1  # noqa: E731
    wait_until("--forever to campaign again and restart the command", restarted, 15)
    second = lines.of("stubborn", "start")[1]
    assert int(second[1]) != first_pid and int(second[2]) > first_token
    proc.send_signal(signal.SIGINT)  # forwarded: the command exits 3 on SIGINT
    assert spawner.wait(proc) == 3
    assert not pid_alive(int(second[1]))


def test_a_sigpipe_neither_stops_aioelect_run_nor_reaches_cmd(mysql_dsn: str, spawner: Spawner, tmp_path: Path) -> None:
    """The kernel sends SIGPIPE for a write on a socket whose other end closed (a server that ended the lock
    session, a probe client gone): it never asks aioelect to stop, and CMD never hears of it."""
    lines = Lines(tmp_path / "ticks")
    proc = spawner.run_cmd("--mysql", mysql_dsn, "--name", f"pipe-{secrets.token_hex(4)}", "--identity", "p",
                           out=lines.path, mode="graceful")  # fmt: skip
    wait_until("the command to start", lambda: bool(lines.of("p", "start")), 20)
    proc.send_signal(signal.SIGPIPE)
    ticks = len(lines.of("p", "tick"))
    wait_until("CMD to go on ticking", lambda: len(lines.of("p", "tick")) >= ticks + 5, 10)
    assert proc.poll() is None, spawner.stderr(proc)
    assert not [row for row in lines.of("p", "signal-13")], "CMD was sent SIGPIPE"
    proc.send_signal(signal.SIGTERM)
    assert spawner.wait(proc) == 10 + signal.SIGTERM  # the graceful CMD exits 10 + the signal it got


def test_forever_runs_cmd_again_after_it_exits(mysql_dsn: str, spawner: Spawner, tmp_path: Path) -> None:
    lines = Lines(tmp_path / "ticks")
    proc = spawner.run_cmd("--mysql", mysql_dsn, "--name", f"forever-{secrets.token_hex(4)}", "--identity", "f",
                           "--forever", "--restart-delay", "0.1", out=lines.path, mode="once")  # fmt: skip
    wait_until("three runs of the command", lambda: len(lines.of("f", "start")) >= 3, 20)
    tokens = [int(row[2]) for row in lines.of("f", "start")]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
    proc.send_signal(signal.SIGTERM)
    assert spawner.wait(proc) in (0, 128 + signal.SIGTERM)  # between runs, or stopped while campaigning


# --- leader and observe -----------------------------------------------------------------------


def test_leader_exits_1_when_nobody_leads(target: Target) -> None:
    plain = cli("leader", *target.with_name())
    assert (plain.returncode, plain.stdout) == (1, ""), plain.stderr
    as_json = cli("leader", "--json", *target.with_name())
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout) == {"leader": None, "handover": None}


def test_observe_prints_one_line_per_change(target: Target, spawner: Spawner, tmp_path: Path) -> None:
    backend = [*target.with_name(), *target.tuning]
    watcher = spawner.start("observe", "--json", *backend)
    plain = spawner.start("observe", *backend)

    def seen(proc: subprocess.Popen[str]) -> list[str | None]:
        return [json.loads(line)["leader"] for line in spawner.stdout(proc).splitlines() if line.strip()]

    def seen_plain() -> list[str]:
        return [line.split(None, 1)[1] for line in spawner.stdout(plain).splitlines() if line.strip()]

    wait_until("the first observations", lambda: seen(watcher) == [None] and seen_plain() == ["no leader"], 20)
    lines = Lines(tmp_path / "ticks")
    runner = spawner.run_cmd(*backend, "--identity", "watched", out=lines.path)
    wait_until("observe --json to report the new leader", lambda: seen(watcher) == [None, "watched"], 20)
    wait_until("observe to report the new leader", lambda: seen_plain() == ["no leader", "leader watched"], 20)
    runner.send_signal(signal.SIGTERM)
    spawner.wait(runner)
    wait_until("observe --json to report no leader", lambda: seen(watcher) == [None, "watched", None], 20)
    wait_until("observe to report no leader", lambda: seen_plain() == ["no leader", "leader watched", "no leader"], 20)

    first = json.loads(spawner.stdout(watcher).splitlines()[0])
    assert first["backend"] == target.kind and first["time"].endswith("Z")
    time.sleep(0.5)  # nothing more than the changes: no repeated lines while nothing changes
    assert len(seen(watcher)) == 3 and len(seen_plain()) == 3
    for proc in (watcher, plain):
        proc.send_signal(signal.SIGINT)
        assert spawner.wait(proc) == 0


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "required"),
        (["leader"], "no backend configured"),
        (["run", "--mysql", "mysql://root@127.0.0.1:1/db"], "needs a command after --"),
        (["observe", "--mysql", "mysql://root@127.0.0.1:1/db", "--", "true"], "takes no command"),
        (["leader", "--mysql", "mysql://root@127.0.0.1:1/db", "--ttl", "3"], "--ttl applies to etcd only"),
        (["leader", "--mysql", "mysql://root@127.0.0.1:1/db", "--etcd", "127.0.0.1:1"], "give only one of"),
        (["leader", "--file", "/tmp/x", "--poll-interval", "-1"], "finite number > 0"),
        (["leader", "--mysql", "127.0.0.1:3306"], "DSN"),
        (["leader", "--mysql", "mysql://root@127.0.0.1:1/db", "--name", ""], "name"),
        (["leader", "--mysql", "mysql://root@127.0.0.1:1/db", "--password-file", "/no/such/file"], "password-file"),
        (["leader", "--etcd", "127.0.0.1:1", "--name", "/t", "--poll-interval", "1"], "--poll-interval does not apply"),
        (["leader", "--etcd", "127.0.0.1:1", "--name", "/t", "--ttl", "2.5"], "whole number"),
        (["leader", "--mysql", "mysql://root@127.0.0.1:1/db"], "needs an election name"),
        (["leader", "--etcd", "127.0.0.1:1"], "--name"),
        (["run", "--mysql", "mysql://root@127.0.0.1:1/db", "--grace", "nope", "--", "true"], "not a number"),
        (["leader", "--file", "/tmp/x", "--check-interval", "0"], "finite number > 0"),
        (
            [
                "run",
                "--mysql",
                "mysql://root@127.0.0.1:1/db",
                "--name",
                "t",
                "--renew-deadline",
                "9",
                "--grace",
                "1",
                "--",
                "true",
            ],
            "lease 10s less renew deadline 9s), 0.5s of which are kept for SIGKILL; give --grace 0.5 or less, a longer "
            "--lease or a shorter --renew-deadline",
        ),
        (
            ["leader", "--mysql", "mysql://root@127.0.0.1:1/db", "--name", "t", "--renew-deadline", "12"],
            "renew_deadline (12s) must be shorter than lease (10s)",
        ),
        (
            [
                "run",
                "--postgres",
                "postgresql://u@127.0.0.1:1/db",
                "--name",
                "t",
                "--check-interval",
                "3",
                "--check-timeout",
                "2.5",
                "--",
                "true",
            ],
            "must not exceed renew_deadline",
        ),
    ],
)
def test_bad_usage_exits_2_with_a_message(args: list[str], message: str) -> None:
    result = cli(*args, timeout=20)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "environ", "timing"),
    [
        (
            ["--mysql", "mysql://app@127.0.0.1:1/app", "--renew-deadline", "5", "--check-interval", "0.5"],
            {},
            "check_interval=0.5s check_timeout=2s renew_deadline=5s lease=10s",
        ),
        (
            ["--postgres", "postgresql://app@127.0.0.1:1/app", "--lease", "20", "--check-timeout", "1"],
            {"AIOELECT_RENEW_DEADLINE": "9", "AIOELECT_CHECK_INTERVAL": "2"},
            "check_interval=2s check_timeout=1s renew_deadline=9s lease=20s",
        ),
        (
            ["--mysql", "mysql://app@127.0.0.1:1/app", "--renew-deadline", "6"],
            {"AIOELECT_RENEW_DEADLINE": "4"},
            "renew_deadline=6s lease=10s",
        ),
        (["--etcd", "127.0.0.1:1", "--ttl", "6", "--renew-deadline", "3.5"], {}, "renew_deadline=3.5s"),
        (
            ["--redis", "redis://127.0.0.1:1/0", "--renew-deadline", "4", "--check-interval", "0.25"],
            {},
            "renew_deadline=4",
        ),
    ],
    ids=["mysql-flags", "postgres-flags-over-variables", "flag-over-variable", "etcd", "redis"],
)
def test_the_timing_flags_reach_the_backend(args: list[str], environ: dict[str, str], timing: str) -> None:
    """--renew-deadline, --check-interval and --check-timeout set the library's options, over the variables."""
    from aioelect.cli._args import build_parser
    from aioelect.cli._configure import configure
    from aioelect.wiring._settings import Settings

    parsed = build_parser().main.parse_args(["leader", "--name", "cli/timing", *args])
    elector = configure(parsed, Settings.from_environ(environ)).build()
    assert timing in elector._backend.describe_timing(), elector._backend.describe_timing()


def test_a_timing_flag_the_backend_has_not_is_ignored_at_warning(tmp_path: Path) -> None:
    """On the file backend --renew-deadline means nothing: said once at WARNING (shown under -q), as the library
    says it; CMD runs."""
    marker = tmp_path / "ran"
    lock = ["--file", str(tmp_path / "leader.lock")]
    timing = ["--renew-deadline", "2", "--check-timeout", "1", "--check-interval", "0.25"]
    result = cli("run", *lock, *timing, "-q", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert result.returncode == 0, result.stderr
    assert marker.exists()
    lines = result.stderr.splitlines()
    for option in ("renew_deadline=2.0", "check_timeout=1.0"):
        assert sum(f"{option} means nothing to the file backend, ignored" in line for line in lines) == 1, lines
    assert len(lines) == 2, lines


def test_help_explains_options_environment_and_exit_codes() -> None:
    result = cli("run", "--help")
    assert result.returncode == 0
    for text in ("--etcd", "--mysql", "--postgres", "--file", "--name", "--ttl", "--identity", "--password-file",
                 "--grace", "--forever", "AIOELECT_MYSQL_DSN", "AIOELECT_ETCD_ENDPOINTS", "AIOELECT_PASSWORD",
                 "exit status", "SIGKILL", "SIGHUP", "setsid", "84 ms", "Not covered", "--renew-deadline",
                 "--check-interval", "--check-timeout", "AIOELECT_CHECK_INTERVAL"):  # fmt: skip
        assert text in result.stdout, text


@pytest.mark.parametrize("kind", ["mysql", "etcd"])
@pytest.mark.parametrize("command", ["leader", "observe", "run"])
def test_unreachable_server_exits_3_quickly(kind: str, command: str, tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    backend = ["--mysql", f"mysql://root:pw-{port}@127.0.0.1:{port}/db"] if kind == "mysql" else [
        "--etcd", f"127.0.0.1:{port}"]  # fmt: skip
    marker = tmp_path / "ran"
    extra = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"] if command == "run" else []
    started = time.monotonic()
    result = cli(command, *backend, "--name", "unreachable", "--timeout", "5", *extra, timeout=30)
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    assert "unreachable" in result.stderr or "did not answer" in result.stderr
    assert f"pw-{port}" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    assert elapsed < 15
    assert not marker.exists(), "the command ran without leadership"


def test_passwords_come_from_env_or_file_and_are_never_printed(
    mariadb: MariaDBServer, spawner: Spawner, tmp_path: Path
) -> None:
    secret = f"Pw-{secrets.token_hex(6)}!"
    mariadb.create_user("cli_user", secret)
    dsn = f"mysql://cli_user@127.0.0.1:{mariadb.port}/{mariadb.database}"
    name = ["--mysql", dsn, "--name", f"pw-{secrets.token_hex(4)}"]

    wrong = cli("leader", *name, AIOELECT_PASSWORD=secret + "x")
    assert wrong.returncode == 3 and "Access denied" in wrong.stderr, wrong.stderr
    assert secret not in wrong.stderr + wrong.stdout

    password_file = tmp_path / "password"
    password_file.write_text(secret + "\n")
    assert cli("leader", *name, "--password-file", str(password_file)).returncode == 1  # reached: nobody leads

    lines = Lines(tmp_path / "ticks")
    proc = spawner.run_cmd(*name, "-v", "--identity", "pw", out=lines.path, mode="once", AIOELECT_PASSWORD=secret)
    assert spawner.wait(proc) == 0
    assert lines.of("pw", "start")
    assert secret not in spawner.stderr(proc) + spawner.stdout(proc)

    # A password inside the DSN is not echoed either, whatever goes wrong.
    inline = f"mysql://cli_user:{secret}@127.0.0.1:{free_port()}/db"
    for args in (["leader", "--mysql", inline], ["leader", "--mysql", inline, "--ttl", "1"]):
        result = cli(*args, "--timeout", "5")
        assert result.returncode in (2, 3)
        assert secret not in result.stderr + result.stdout


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "aioelect"
    if not script.exists():
        pytest.skip("the aioelect console script is not installed in this environment")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.startswith("aioelect ")


# --- work that outlives the lock: --grace and CMD's process group -----------------------------

#: CMD for the process-group tests: ignores SIGTERM, starts a child (in its group) that ignores it too,
#: writes "PGID CHILD-PID" to argv[1], then runs until killed. With "exit" as argv[2], it exits at once instead.
GROUP = """\
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(f"{os.getpgrp()} {child.pid}\\n")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2] == "exit":
    sys.exit(0)
time.sleep(120)
"""

#: CMD of the successor: writes the live (non-zombie) processes of process group argv[2] to argv[1] at start.
SURVIVORS = """\
import os, sys
pgid, alive = int(sys.argv[2]), []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(entry)
with open(sys.argv[1], "w") as fh:
    fh.write(" ".join(alive) + "\\n")
"""


def group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def kill_group(pgid: int) -> None:
    """Teardown: never leave the test's command group behind, whatever happened."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("backend", "grace", "margin"),
    [("mysql", "2.6", "3s"), ("mysql", "10", "3s"), ("etcd", "1.5", "1.67s"), ("etcd-ttl3", "0.6", "1s")],
)
def test_grace_longer_than_the_safety_margin_is_refused_with_the_reason(
    backend: str, grace: str, margin: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if backend == "mysql":
        options = ["--mysql", request.getfixturevalue("mysql_dsn")]
    else:
        options = ["--etcd", ",".join(request.getfixturevalue("etcd_endpoints"))]
        options += ["--ttl", "3"] if backend == "etcd-ttl3" else []
    marker = tmp_path / "ran"
    result = cli("run", *options, "--name", f"grace-{secrets.token_hex(4)}", "--grace", grace,
                 "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--grace" in result.stderr and "margin" in result.stderr and margin in result.stderr, result.stderr
    assert "before the lock can pass" in result.stderr, result.stderr
    assert not marker.exists(), "CMD ran with a grace the backend cannot honour"


@pytest.mark.parametrize(
    "options", [["--grace", "2"], ["--lease", "30", "--grace", "8"]], ids=["default-lease", "lease-30"]
)
def test_grace_within_the_margin_is_accepted(mysql_dsn: str, options: list[str], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = cli("run", "--mysql", mysql_dsn, "--name", f"grace-{secrets.token_hex(4)}", *options,
                 "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert marker.exists()


def test_lease_applies_to_sql_backends_only(etcd_endpoints: list[str]) -> None:
    result = cli("run", "--etcd", ",".join(etcd_endpoints), "--name", "/t", "--lease", "30", "--", "true")
    assert result.returncode == 2 and "--lease applies to the SQL and Redis backends only" in result.stderr, (
        result.stderr
    )


@pytest.mark.parametrize("kind", ["etcd", "mysql"])
def test_cut_off_leaders_whole_command_group_is_dead_before_a_successor_starts(
    kind: str,
    request: pytest.FixtureRequest,
    tcp_proxy_factory: Callable[[str, int], TCPProxy],
    spawner: Spawner,
    tmp_path: Path,
) -> None:
    # Short leases, default --grace (half the margin): etcd --ttl 3 (renew deadline 2s, 1s of margin),
    # MySQL --lease 5 (wait_timeout 5s, renew deadline 3.5s, 1.5s of margin).
    if kind == "etcd":
        etcd: EtcdServer = request.getfixturevalue("etcd")
        proxy = tcp_proxy_factory("127.0.0.1", etcd.port)
        name = f"/cli-group/{secrets.token_hex(4)}"
        through_proxy = ["--etcd", proxy.endpoint, "--ttl", "3", "--name", name]
        direct = ["--etcd", etcd.endpoint, "--ttl", "3", "--name", name]
    else:
        mariadb: MariaDBServer = request.getfixturevalue("mariadb")
        proxy = tcp_proxy_factory("127.0.0.1", mariadb.port)
        name = f"cli-group-{secrets.token_hex(4)}"
        dsn = f"mysql://root@127.0.0.1:{{}}/{mariadb.database}"
        through_proxy = ["--mysql", dsn.format(proxy.port), "--lease", "5", "--name", name]
        direct = ["--mysql", dsn.format(mariadb.port), "--lease", "5", "--name", name, "--poll-interval", "0.2"]
    group_script, survivors_script = tmp_path / "group.py", tmp_path / "survivors.py"
    group_script.write_text(GROUP)
    survivors_script.write_text(SURVIVORS)
    started, seen = tmp_path / "group-started", tmp_path / "survivors-seen"
    leader = spawner.start("run", *through_proxy, "--identity", "cut-off",
                           "--", sys.executable, str(group_script), str(started))  # fmt: skip
    wait_until("the leader's command and its child", started.exists, 20)
    pgid, child = map(int, started.read_text().split())
    try:
        assert set(group_members(pgid)) >= {pgid, child}
        successor = spawner.start("run", *direct, "--identity", "successor", "--",
                                  sys.executable, str(survivors_script), str(seen), str(pgid))  # fmt: skip
        time.sleep(1.0)  # the successor is campaigning
        assert not seen.exists(), "the successor ran while the leader held the lock"
        proxy.stall()  # the leader is cut off: it loses at its renew deadline, the server drops it later
        stalled = time.monotonic()
        wait_until("the successor to lead and run its command", seen.exists, 20)
        alive = seen.read_text().split()
        assert alive == [], f"processes of the deposed leader's command still ran when the successor started: {alive}"
        stderr = spawner.stderr(leader)
        assert "leadership lost" in stderr and "sending SIGKILL" in stderr, stderr  # SIGTERM alone did not do
        assert spawner.wait(successor) == 0
        print(f"successor ran {time.monotonic() - stalled:.2f}s after the cut; the leader logged:\n{stderr}")
    finally:
        kill_group(pgid)


def test_processes_left_in_cmds_group_are_killed_before_the_release(
    mysql_dsn: str, spawner: Spawner, tmp_path: Path
) -> None:
    group_script = tmp_path / "group.py"
    group_script.write_text(GROUP)
    started = tmp_path / "group-started"
    proc = spawner.start("run", "--mysql", mysql_dsn, "--name", f"left-{secrets.token_hex(4)}", "--grace", "0.5",
                         "--", sys.executable, str(group_script), str(started), "exit")  # fmt: skip
    try:
        assert spawner.wait(proc, timeout=30) == 0, spawner.stderr(proc)
        pgid, child = map(int, started.read_text().split())
        assert group_members(pgid) == [], "a process of CMD's group outlived the leadership"
        assert not pid_alive(child)
        assert "are still running after CMD exited" in spawner.stderr(proc)
    finally:
        if started.exists():
            kill_group(int(started.read_text().split()[0]))


# --- run --no-wait: try once, like flock -n -----------------------------------------------------


def a_holder_and_a_job(
    target: Target, spawner: Spawner, tmp_path: Path
) -> tuple[Lines, list[str], subprocess.Popen[str], list[str]]:
    """An instance ``holder`` that leads and runs its command, and the command line of a short job to try beside it."""
    lines = Lines(tmp_path / "ticks")
    backend = [*target.with_name(), *target.tuning]
    holder = spawner.run_cmd(*backend, "--identity", "holder", out=lines.path)
    wait_until("the holder to run its command", lambda: bool(lines.of("holder", "start")), 30)
    return lines, backend, holder, [sys.executable, str(spawner.script), str(lines.path), "once"]


def test_run_no_wait_exits_75_while_another_leads_and_runs_cmd_once_when_free(
    target: Target, spawner: Spawner, tmp_path: Path
) -> None:
    lines, backend, holder, once = a_holder_and_a_job(target, spawner, tmp_path)

    started = time.monotonic()
    tried = cli("run", *backend, "--no-wait", "--identity", "cron", "--", *once)
    assert tried.returncode == 75, tried.stderr
    assert time.monotonic() - started < 15, "--no-wait must not wait for the leader"
    assert lines.of("cron") == [], "CMD must not run while another instance leads"
    assert "another instance leads" in tried.stderr

    holder.send_signal(signal.SIGTERM)
    spawner.wait(holder)
    ran = cli("run", *backend, "--no-wait", "--identity", "cron", "--", *once)
    assert ran.returncode == 0, ran.stderr
    (start,) = lines.of("cron", "start")
    assert start[2] != "-", "fencing tokens are on by default: CMD gets AIOELECT_TOKEN"

    both = cli("run", *backend, "--no-wait", "--forever", "--", *once)
    assert both.returncode == 2 and "--no-wait" in both.stderr


@pytest.mark.parametrize("target", ["file"], indirect=True)  # the exit status is the command line's, not a backend's
def test_run_no_wait_conflict_exit_code_is_the_status_while_another_leads(
    target: Target, spawner: Spawner, tmp_path: Path
) -> None:
    """--conflict-exit-code N, as flock -E: a CronJob or systemd unit that counts 75 as failure asks for 0."""
    lines, backend, holder, once = a_holder_and_a_job(target, spawner, tmp_path)
    for code in ("0", "3"):
        tried = cli("run", *backend, "--no-wait", "--conflict-exit-code", code, "--identity", "cron", "--", *once)
        assert tried.returncode == int(code), tried.stderr
        assert f"exit status {code}" in tried.stderr
    assert lines.of("cron") == [], "CMD must not run while another instance leads"
    holder.send_signal(signal.SIGTERM)
    spawner.wait(holder)
    waits = cli("run", *backend, "--conflict-exit-code", "0", "--", *once)
    assert waits.returncode == 2 and "--no-wait only" in waits.stderr
    for bad in ("256", "-1", "x"):
        refused = cli("run", *backend, "--no-wait", "--conflict-exit-code", bad, "--", *once)
        assert refused.returncode == 2 and "--conflict-exit-code" in refused.stderr, refused.stderr


def test_mysql_without_a_database_names_no_fencing() -> None:
    refused = cli("leader", "--mysql", f"mysql://root@127.0.0.1:{free_port()}", "--name", "x", "--timeout", "2")
    assert refused.returncode == 2, refused.stderr
    assert "--no-fencing" in refused.stderr and "database" in refused.stderr
    unreachable = cli(
        "leader", "--mysql", f"mysql://root@127.0.0.1:{free_port()}", "--name", "x", "--no-fencing", "--timeout", "2"
    )
    assert unreachable.returncode == 3, unreachable.stderr  # configured: only the server is missing


def test_default_grace_of_a_long_margin_is_waited_out_before_the_release(
    redis_url: str,
    tcp_proxy_factory: Callable[[str, int], TCPProxy],
    spawner: Spawner,
    tmp_path: Path,
) -> None:
    # The default --grace is half the safety margin (here (44 - 2) / 2 = 21 s), but the elector's stop_timeout
    # was computed from --grace as given (None: 10 s) plus 5 s: after a loss the keeper gave up waiting for
    # CMD at 15 s and released the key while CMD, ignoring SIGTERM, still ran until its grace ended. A leader
    # that lost at its renew deadline and reached the server again then let the next leader's CMD start beside
    # its own, long before the key's expiry.
    host, port = redis_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    proxy = tcp_proxy_factory(host, int(port))
    name = f"grace-{secrets.token_hex(4)}"
    timing = ["--lease", "44", "--renew-deadline", "2", "--name", name]
    lines = Lines(tmp_path / "ticks")
    leader = spawner.run_cmd("--redis", f"redis://{host}:{proxy.port}/0", *timing, "--identity", "a",
                             out=lines.path, mode="stubborn")  # fmt: skip
    wait_until("a to run its command", lambda: bool(lines.of("a", "start")), 30)
    successor = spawner.run_cmd("--redis", redis_url, *timing, "--identity", "b", out=lines.path)
    time.sleep(1.0)  # b campaigns
    proxy.stall()
    wait_until("a to lose at its renew deadline", lambda: "leadership lost" in spawner.stderr(leader), 10)
    proxy.passthrough()  # a reaches the server again: its release is heard
    wait_until("b to run its command", lambda: bool(lines.of("b", "start")), 60)
    time.sleep(1.0)  # a's CMD, were it still running, ticks every 0.1 s
    rows = lines.rows()
    a_after = [row for row in rows[rows.index(lines.of("b", "start")[0]) :] if row[0] == "a"]
    assert a_after == [], f"a's CMD still ran after b's started: {a_after[:3]}...\n{spawner.stderr(leader)}"
    for proc in (leader, successor):
        proc.send_signal(signal.SIGTERM)
