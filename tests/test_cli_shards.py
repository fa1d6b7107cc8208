"""``aioelect shards``: one CMD per owned name, stopped before the name is handed over.

Each CMD appends ``start``/``stop`` lines (name, token, identity, monotonic time) to one file; a name's CMDs
on two instances must never run at once.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.harness import EtcdServer, PostgresServer

from .test_cli import Spawner, wait_until

pytestmark = pytest.mark.timeout(90)

WORKER = """\
import os, signal, sys, time
def line(event):
    with open(sys.argv[1], "a") as fh:
        fh.write(" ".join([event, os.environ["AIOELECT_SHARD"], os.environ["AIOELECT_TOKEN"],
                           os.environ["AIOELECT_IDENTITY"], str(os.getpid()), repr(time.monotonic())]) + "\\n")
def stop(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # forwarded, then the tree's own SIGTERM: one stop line
    line("stop")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
line("start")
while True:
    time.sleep(1)
"""


def events(path: Path) -> list[tuple[str, str, int, str, int, float]]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        event, name, token, identity, pid, t = line.split()
        found.append((event, name, int(token), identity, int(pid), float(t)))
    return found


def running(path: Path) -> dict[str, str]:
    """Name -> identity of the CMD running now (started, not stopped)."""
    now: dict[str, str] = {}
    for event, name, _, identity, _, _ in events(path):
        if event == "start":
            assert name not in now, f"{name}: {identity}'s CMD started while {now[name]}'s runs"
            now[name] = identity
        else:
            assert now.get(name) == identity, f"{name}: {identity}'s CMD stopped but it was not running"
            del now[name]
    return now


def start(spawner: Spawner, backend: list[str], group: str, identity: str, out: Path, *extra: str) -> Any:
    worker = spawner.tmp / "worker.py"
    worker.write_text(WORKER)
    return spawner.start(
        "shards",
        *backend,
        "--name",
        group,
        "--identity",
        identity,
        "--names",
        "a,b,c,d",
        *extra,
        "--",
        sys.executable,
        str(worker),
        str(out),
    )


@pytest.fixture
def spawner(tmp_path: Path) -> Any:
    s = Spawner(tmp_path)
    try:
        yield s
    finally:
        for proc in s.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _handover(spawner: Spawner, backend: list[str], tmp_path: Path) -> float:
    """Move A's names to B by a SIGTERM to A; return the longest gap between A's CMD stopping and B's starting."""
    out = tmp_path / "cmds.log"
    group = f"cli-shards-{secrets.token_hex(3)}"
    first = start(spawner, backend, group, "A", out)
    second = start(spawner, backend, group, "B", out)
    wait_until("two CMDs per instance", lambda: sorted(Counter(running(out).values()).values()) == [2, 2], 30)
    assert {e[1] for e in events(out)} == {"a", "b", "c", "d"} and all(e[2] > 0 for e in events(out))
    tokens = {e[1]: e[2] for e in events(out) if e[0] == "start"}  # the tokens of the balanced owners
    signalled = time.monotonic()
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 128 + signal.SIGTERM
    wait_until("B runs every CMD", lambda: running(out) == dict.fromkeys("abcd", "B"), 30)
    # A's names: A's CMD stopped before B's started (the name was let go once its CMD was gone), new token.
    stops = {e[1]: e[5] for e in events(out) if e[0] == "stop" and e[3] == "A" and e[5] >= signalled}
    assert len(stops) == 2
    gaps = []
    for name, stopped in stops.items():
        taken = [e for e in events(out) if e[0] == "start" and e[1] == name and e[3] == "B" and e[5] >= signalled]
        assert taken and taken[0][5] > stopped and taken[0][2] > tokens[name]
        gaps.append(taken[0][5] - stopped)
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 128 + signal.SIGTERM
    assert running(out) == {}
    pids = {e[4] for e in events(out)}
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
    return max(gaps)


#: A name A let go on SIGTERM is released, not left to expire: B takes it well within this, and the etcd lease
#: (10 s) is longer, so a wait for its expiry fails the test.
RELEASED_WITHIN = 6.0


def test_names_move_between_instances_on_etcd(etcd: EtcdServer, spawner: Spawner, tmp_path: Path) -> None:
    gap = _handover(spawner, ["--etcd", etcd.endpoint, "--ttl", "10"], tmp_path)
    print(f"etcd: longest gap {gap:.2f}s")
    assert gap < RELEASED_WITHIN


def test_names_move_between_instances_on_postgres(postgres: PostgresServer, spawner: Spawner, tmp_path: Path) -> None:
    gap = _handover(spawner, ["--postgres", postgres.dsn], tmp_path)
    print(f"postgres: longest gap {gap:.2f}s")
    assert gap < RELEASED_WITHIN


def _drain(spawner: Spawner, backend: list[str], tmp_path: Path) -> float:
    """Three instances; a SIGTERM drains one: its names go to the two others (each CMD stopped first), never one
    name's CMD on two instances at once. Returns the longest gap between a CMD stopping and its successor starting."""
    out = tmp_path / "cmds.log"
    group = f"cli-drain-{secrets.token_hex(3)}"
    procs = {ident: start(spawner, backend, group, ident, out) for ident in ("A", "B", "C")}
    wait_until("every name running once", lambda: len(running(out)) == 4 and len(set(running(out).values())) == 3, 30)
    leaving = next(i for i, n in Counter(running(out).values()).items() if n == 2)
    mine = {name for name, owner in running(out).items() if owner == leaving}
    signalled = time.monotonic()
    procs[leaving].send_signal(signal.SIGTERM)
    assert procs[leaving].wait(30) == 128 + signal.SIGTERM
    stay = set(procs) - {leaving}
    wait_until(
        "the two others run every CMD",
        lambda: set(running(out)) == set("abcd") and set(running(out).values()) == stay,
        30,
    )
    assert sorted(Counter(running(out).values()).values()) == [2, 2]
    gaps = []
    for name in mine:
        stopped = [e[5] for e in events(out) if e[0] == "stop" and e[1] == name and e[3] == leaving]
        taken = [e[5] for e in events(out) if e[0] == "start" and e[1] == name and e[3] in stay and e[5] >= signalled]
        assert stopped and taken and taken[0] > stopped[-1]
        gaps.append(taken[0] - stopped[-1])
    for ident in stay:
        procs[ident].send_signal(signal.SIGTERM)
    for ident in stay:
        assert procs[ident].wait(30) == 128 + signal.SIGTERM
    assert running(out) == {}
    return max(gaps)


@pytest.mark.parametrize("kind", ["file", "redis", "etcd", "mysql"])
def test_sigterm_drains_an_instance_s_names_to_the_others(
    kind: str, request: pytest.FixtureRequest, spawner: Spawner, tmp_path: Path
) -> None:
    """The leases here (20 s) are far longer than RELEASED_WITHIN: the names move by release."""
    if kind == "file":
        backend = ["--file", str(tmp_path / "lock")]
    elif kind == "redis":
        backend = ["--redis", request.getfixturevalue("redis_url"), "--lease", "20"]
    elif kind == "etcd":
        backend = ["--etcd", ",".join(request.getfixturevalue("etcd_endpoints")), "--ttl", "20"]
    else:
        backend = ["--mysql", request.getfixturevalue("mysql_dsn")]
    gap = _drain(spawner, backend, tmp_path)
    print(f"{kind}: drain on SIGTERM, longest gap {gap:.2f}s")
    assert gap < RELEASED_WITHIN


def test_shards_needs_a_reachable_backend_and_a_command(tmp_path: Path) -> None:
    from .test_cli import cli

    done = cli("shards", "--etcd", "127.0.0.1:9", "--timeout", "2", "--name", "g", "--names", "a", "--", "true")
    assert done.returncode == 3, done.stderr
    done = cli("shards", "--file", str(tmp_path / "lock"), "--name", "g", "--names", "a")
    assert done.returncode == 2 and "needs a command" in done.stderr


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a count built up front would hit this


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ("99999999999999", "at most 100000"),
        ("100001", "at most 100000"),
        ("0000000000000000000000000100001", "at most 100000"),
        ("9" * 5000, "at most 100000"),  # beyond int()'s digit limit too
        ("²", "digits 0-9"),  # str.isdigit() is true, int() refuses it
        ("١٢", "digits 0-9"),  # Arabic-Indic digits: int() would take them for 12
    ],
)
def test_a_shard_count_out_of_bounds_or_not_in_ascii_digits_is_a_usage_error(names: str, message: str) -> None:
    """``--names COUNT``: refused with exit status 2 and the reason, before any name is built, in 1 GiB."""
    from .test_cli import ROOT, _env, aioelect_argv

    argv = aioelect_argv("shards", "--etcd", "127.0.0.1:9", "--timeout", "2", "--name", "g", "--names", names)
    started = time.monotonic()
    done = subprocess.run(
        [*argv, "--", "true"], capture_output=True, text=True, timeout=60, env=_env(), cwd=ROOT,
        preexec_fn=_limit_memory,
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "--names" in done.stderr and took < 30, took


def test_the_largest_shard_count_is_accepted() -> None:
    """``--names 100000`` passes the usage checks: the unreachable etcd is what stops it (exit status 3)."""
    from .test_cli import cli

    done = cli("shards", "--etcd", "127.0.0.1:9", "--timeout", "2", "--name", "g", "--names", "100000", "--", "true")
    assert done.returncode == 3 and "unreachable" in done.stderr, done.stderr[-2000:]
