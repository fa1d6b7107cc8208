"""``aioelect step-down`` on real servers: the leader, wherever it runs, hands over to the named candidate."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from .test_cli import Lines, Spawner, Target, cli, target, wait_until

__all__ = ["target"]  # the fixture, shared with test_cli


def handover_options(target: Target) -> list[str]:
    """What this backend's candidates need for handover notes (PostgreSQL keeps them beside its leaders table)."""
    return ["--schema", "public"] if target.kind == "postgres" else []


def test_step_down_to_a_named_instance_moves_cmd_there_at_once(
    target: Target, spawner: Spawner, tmp_path: Path
) -> None:
    lines = Lines(tmp_path / "ticks")
    backend = [*target.with_name(), *target.tuning, *handover_options(target)]
    procs = {}
    procs["cand-a"] = spawner.run_cmd(
        *backend, "--identity", "cand-a", "--forever", "--serve-step-down", out=lines.path, mode="graceful"
    )
    wait_until("cand-a to run the command", lambda: bool(lines.of("cand-a", "start")), 30)
    for ident in ("cand-b", "cand-c"):
        procs[ident] = spawner.run_cmd(*backend, "--identity", ident, "--forever", out=lines.path, mode="graceful")
    time.sleep(1.0)  # both wait
    started = time.monotonic()
    asked = cli("step-down", *backend, "--to", "cand-c", "--json")
    took = time.monotonic() - started
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout) == {"leader": "cand-c", "was": "cand-a", "to": "cand-c"}
    assert took < 10, took  # a release, not a lease expiry
    wait_until("cand-c to run the command", lambda: bool(lines.of("cand-c", "start")), 10)
    # cand-a's command was stopped gracefully (SIGTERM) before cand-c's started; cand-b never ran it.
    assert lines.of("cand-a", f"signal-{int(signal.SIGTERM)}")
    assert not lines.of("cand-b")
    order = [row[0] for row in lines.rows() if row[3] in ("start", f"signal-{int(signal.SIGTERM)}")]
    assert order == ["cand-a", "cand-a", "cand-c"], order
    tokens = [int(lines.of(ident, "start")[0][2]) for ident in ("cand-a", "cand-c")]
    assert tokens[1] > tokens[0], tokens
    shown = cli("leader", *backend, "--json")
    assert json.loads(shown.stdout) == {"leader": "cand-c", "handover": None}  # taken: no handover in progress
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
        spawner.wait(proc)


def test_step_down_with_nobody_leading_exits_1(target: Target) -> None:
    result = cli("step-down", *target.with_name(), *handover_options(target))
    assert result.returncode == 1
    assert "nobody leads" in result.stderr


def test_step_down_to_the_leader_itself_asks_nothing(target: Target, spawner: Spawner, tmp_path: Path) -> None:
    lines = Lines(tmp_path / "ticks")
    backend = [*target.with_name(), *target.tuning, *handover_options(target)]
    leader = spawner.run_cmd(
        *backend, "--identity", "cand-a", "--forever", "--serve-step-down", out=lines.path, mode="graceful"
    )
    wait_until("cand-a to run the command", lambda: bool(lines.of("cand-a", "start")), 30)
    asked = cli("step-down", *backend, "--to", "cand-a", "--json")
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout) == {"leader": "cand-a", "was": "cand-a", "to": "cand-a"}
    time.sleep(1.5)  # a served request would have stopped the command by now
    assert not lines.of("cand-a", f"signal-{int(signal.SIGTERM)}")
    assert len(lines.of("cand-a", "start")) == 1
    leader.send_signal(signal.SIGTERM)
    spawner.wait(leader)


def test_a_handover_in_progress_shows_in_leader_and_observe(target: Target, spawner: Spawner, tmp_path: Path) -> None:
    lines = Lines(tmp_path / "ticks")
    backend = [*target.with_name(), *target.tuning, *handover_options(target)]
    leader = spawner.run_cmd(*backend, "--identity", "cand-a", "--serve-step-down", out=lines.path, mode="graceful")
    wait_until("cand-a to run the command", lambda: bool(lines.of("cand-a", "start")), 30)
    watcher = spawner.start("observe", "--json", *backend)
    wait_until("observe to report cand-a", lambda: "cand-a" in spawner.stdout(watcher), 20)
    # Nobody called "ghost" campaigns: the window stays open (and shows) until it ends.
    asked = cli("step-down", *backend, "--to", "ghost", "--window", "20", "--wait", "2")
    assert asked.returncode == 0, asked.stderr
    shown = json.loads(cli("leader", *backend, "--json").stdout)
    assert shown["leader"] is None
    assert shown["handover"]["from"] == "cand-a" and shown["handover"]["to"] == "ghost"
    assert 0 < shown["handover"]["seconds_left"] <= 20

    def reports() -> list[dict[str, object]]:
        return [json.loads(line) for line in spawner.stdout(watcher).splitlines() if line.strip()]

    wait_until("observe to report no leader", lambda: reports()[-1]["leader"] is None, 20)
    handover = reports()[-1]["handover"]
    assert isinstance(handover, dict) and handover["to"] == "ghost"
    spawner.wait(leader)  # without --forever, run ends once CMD has stopped
    watcher.send_signal(signal.SIGINT)
    assert spawner.wait(watcher) == 0


def test_health_cmd_failing_moves_cmd_to_a_healthy_instance(target: Target, spawner: Spawner, tmp_path: Path) -> None:
    lines = Lines(tmp_path / "ticks")
    backend = [*target.with_name(), *target.tuning, *handover_options(target)]
    flags = {ident: tmp_path / f"{ident}.healthy" for ident in ("cand-a", "cand-b")}
    flags["cand-a"].touch()
    health = ["--health-interval", "0.2", "--health-timeout", "5", "--health-failures", "2", "--health-backoff", "30"]
    procs = {
        ident: spawner.run_cmd(
            *backend, *health, "--health-cmd", f"test -e {flag}", "--identity", ident, out=lines.path, mode="graceful"
        )
        for ident, flag in flags.items()
    }
    wait_until("cand-a to run the command", lambda: bool(lines.of("cand-a", "start")), 30)
    time.sleep(1.0)
    assert not lines.of("cand-b"), "cand-b is unhealthy: it must not campaign"
    flags["cand-b"].touch()
    flags["cand-a"].unlink()  # cand-a fails its check: it steps down, and its command is stopped with SIGTERM
    wait_until("cand-b to run the command", lambda: bool(lines.of("cand-b", "start")), 15)
    assert lines.of("cand-a", f"signal-{int(signal.SIGTERM)}")
    assert "stepping down: unhealthy" in spawner.stderr(procs["cand-a"])
    assert "not campaigning: health check returned False" in spawner.stderr(procs["cand-b"])
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
        spawner.wait(proc)


def test_a_rolling_deploy_with_priorities_moves_leadership_once(
    target: Target, spawner: Spawner, tmp_path: Path
) -> None:
    lines = Lines(tmp_path / "ticks")
    backend = [*target.with_name(), *target.tuning, *handover_options(target)]
    old = {
        ident: spawner.run_cmd(
            *backend, "--identity", ident, "--forever", "--serve-step-down", out=lines.path, mode="graceful"
        )
        for ident in ("old-1", "old-2")
    }
    wait_until("an old instance to run the command", lambda: bool(lines.rows()), 30)
    new = {
        ident: spawner.run_cmd(
            *backend, "--identity", ident, "--priority-settle", "0.3", "--forever", out=lines.path, mode="graceful",
            AIOELECT_PRIORITY="1",
        )
        for ident in ("new-1", "new-2")
    }  # fmt: skip
    wait_until("a new instance to run the command", lambda: any(lines.of(i, "start") for i in new), 20)
    for proc in old.values():  # the old ones go, one at a time
        proc.send_signal(signal.SIGTERM)
        spawner.wait(proc)
    time.sleep(2.0)
    starts = [row[0] for row in lines.rows() if row[3] == "start"]
    assert len(starts) == 2 and starts[0].startswith("old-") and starts[1].startswith("new-"), starts
    for proc in new.values():
        proc.send_signal(signal.SIGTERM)
        spawner.wait(proc)
