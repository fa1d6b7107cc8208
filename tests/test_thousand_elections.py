"""1,000 elections per process at the servers' default limits: three processes of one service, each with one shared
session campaigning in the same 1,000 elections, on MariaDB, PostgreSQL (each started with its default
``max_connections``: 151 and 100) and etcd.

Each process starts its 1,000 campaigns at once (the cold start of a service), and campaigns again for any
leadership it loses, as ``Elector.run()`` does. Every election gets exactly one leader, and the servers count one
connection per process (MariaDB's ``Threads_connected``, PostgreSQL's ``pg_stat_activity``) or one lease per
process (etcd).
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import EtcdServer, MariaDBServer, MissingBinaryError, PostgresServer
from tests.harness.plugin import server_unavailable, skip_if_external
from tests.harness.processes import popen

pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(
        os.environ.get("AIOELECT_TEST_SCALE") != "1",
        reason="`make test-scale` (AIOELECT_TEST_SCALE=1) runs it alone, a step of `make test` before the whole suite",
    ),
]

ROOT = Path(__file__).resolve().parent.parent
CANDIDATE = Path(__file__).parent / "candidates" / "many_elections.py"
ELECTIONS = 1000
PROCESSES = 3
#: The servers' own defaults (the harness raises both for the rest of the suite).
DEFAULT_MAX_CONNECTIONS = {"mysql": 151, "postgres": 100}


def _lines(log: Path) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
    return found


def run_service(backend: str, target: str, tmp: Path, measure: Callable[[], dict[str, int]]) -> dict[str, Any]:
    """Start the processes, wait until every election has a leader, ``measure()`` the servers, stop them; return
    the measurements, the seconds it took, the names each process led and the leaderships lost meanwhile."""
    prefix = f"thousand-{secrets.token_hex(3)}"
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        started = time.monotonic()
        for i in range(PROCESSES):
            log = tmp / f"proc-{i}.log"
            argv = [sys.executable, str(CANDIDATE), f"--backend={backend}", f"--target={target}"]
            argv += [f"--prefix={prefix}", f"--count={ELECTIONS}", f"--identity=proc-{i}"]
            procs.append((popen(argv, log_path=str(log), env={"PYTHONPATH": str(ROOT)}, cwd=str(ROOT)), log))
        held = 0
        deadline = time.monotonic() + 100
        while held < ELECTIONS:
            assert time.monotonic() < deadline, f"only {held} of {ELECTIONS} elections led after 100 s"
            for proc, log in procs:
                assert proc.poll() is None, f"{log.name} exited: {log.read_text()[-2000:]}"
            time.sleep(0.5)
            held = sum(next((e["held"] for e in reversed(_lines(log)) if "held" in e), 0) for _, log in procs)
        took = time.monotonic() - started
        measured = measure()
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, log in procs:
            assert proc.wait(30) == 0, log.read_text()[-2000:]
        led = [next(e["names"] for e in _lines(log) if "names" in e) for _, log in procs]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    lost = sum(next((e["lost"] for e in reversed(_lines(log)) if "lost" in e), 0) for _, log in procs)
    return {"took": took, "led": led, "lost": lost, **measured}


def assert_one_leader_each(led: list[list[str]]) -> None:
    every = [n for names in led for n in names]
    assert len(every) == ELECTIONS and len(set(every)) == ELECTIONS, (len(every), len(set(every)))


@pytest.fixture(params=["mysql", "postgres"])
def default_sql(request: pytest.FixtureRequest) -> Iterator[tuple[str, MariaDBServer | PostgresServer]]:
    """A private MariaDB or PostgreSQL started with its default ``max_connections``."""
    kind = request.param
    skip_if_external(kind)
    limit = DEFAULT_MAX_CONNECTIONS[kind]
    try:
        server: MariaDBServer | PostgresServer = (
            MariaDBServer(extra_args=[f"--max-connections={limit}"])
            if kind == "mysql"
            else PostgresServer(extra_args=["-c", f"max_connections={limit}"])
        )
    except MissingBinaryError as exc:
        server_unavailable(str(exc))
    try:
        server.start()
        yield kind, server
    finally:
        server.cleanup()


def test_three_processes_of_1000_sql_elections_at_default_max_connections(
    default_sql: tuple[str, MariaDBServer | PostgresServer], tmp_path: Path
) -> None:
    kind, server = default_sql

    def connections() -> int:
        if isinstance(server, MariaDBServer):
            # The query's own connection is counted too: a constant, gone from every difference.
            return int(server.query("SHOW GLOBAL STATUS LIKE 'Threads_connected'", database="")[0][1])
        query = (
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return int(server.query(query)[0][0])

    if isinstance(server, MariaDBServer):
        limit = int(server.query("SELECT @@max_connections", database="")[0][0])
    else:
        limit = int(server.query("SHOW max_connections")[0][0])
    assert limit == DEFAULT_MAX_CONNECTIONS[kind]
    baseline = connections()
    result = run_service(kind, server.dsn, tmp_path, lambda: {"connections": connections() - baseline})
    assert result["connections"] == PROCESSES, result["connections"]
    assert_one_leader_each(result["led"])
    deadline = time.monotonic() + 10
    while connections() != baseline:  # the server counts a closed connection out a little after the close
        assert time.monotonic() < deadline, f"{connections() - baseline} connections left"
        time.sleep(0.1)
    print(
        f"{kind}: {PROCESSES} processes x {ELECTIONS} elections led in {result['took']:.1f}s "
        f"on {result['connections']} connections (max_connections {limit}, {result['lost']} leaderships lost)"
    )


def _established(port: int) -> int:
    """Established TCP connections to ``port`` from this machine's processes (/proc/net/tcp, tcp6)."""
    hex_port = f"{port:04X}"
    found = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[2].rsplit(":", 1)[1] == hex_port and fields[3] == "01":  # remote port, ESTABLISHED
                    found += 1
    return found


def test_three_processes_of_1000_etcd_elections_on_three_leases(fresh_etcd: EtcdServer, tmp_path: Path) -> None:
    port = int(fresh_etcd.endpoint.rsplit(":", 1)[1])

    def leases() -> list[str]:
        out = fresh_etcd.etcdctl("lease", "list", check=True).stdout
        return [line for line in out.splitlines()[1:] if line.strip()]

    baseline = _established(port)
    result = run_service(
        "etcd",
        fresh_etcd.endpoint,
        tmp_path,
        lambda: {"leases": len(leases()), "connections": _established(port) - baseline},
    )
    assert result["leases"] == PROCESSES
    assert result["connections"] <= PROCESSES
    assert_one_leader_each(result["led"])
    assert leases() == []
    print(
        f"etcd: {PROCESSES} processes x {ELECTIONS} elections led in {result['took']:.1f}s "
        f"on {result['leases']} leases, {result['connections']} connections ({result['lost']} leaderships lost)"
    )
