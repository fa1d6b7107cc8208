"""Tests that the real-server harness (tests/harness) really works.

Every server here is real and every wait is bounded; the file runs in well
under a minute.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from .harness import (
    EtcdCluster,
    EtcdServer,
    MariaDBServer,
    MissingBinaryError,
    PostgresServer,
    RedisServer,
    TCPProxy,
    free_port,
    require_binary,
)
from .harness.plugin import server_unavailable

REPO_ROOT = Path(__file__).resolve().parent.parent


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


# -- helpers -------------------------------------------------------------------


def test_free_port_is_unique_and_bindable() -> None:
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))


def test_require_binary() -> None:
    assert os.path.isabs(require_binary("no-such-binary-aioelect", "sh"))
    with pytest.raises(MissingBinaryError):
        require_binary("no-such-binary-aioelect")


def test_server_unavailable_fails_in_ci_and_skips_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIOELECT_REQUIRE_SERVERS", raising=False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        server_unavailable("etcd missing")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        server_unavailable("etcd missing")
    monkeypatch.setenv("AIOELECT_REQUIRE_SERVERS", "1")
    with pytest.raises(pytest.fail.Exception):
        server_unavailable("etcd missing")


def test_children_die_with_the_test_process() -> None:
    """SIGKILL the owning process: its server dies too (PDEATHSIG), even though
    the server was started from a short-lived thread."""
    code = (
        "import threading, time\n"
        "from tests.harness import EtcdServer\n"
        "s = EtcdServer()\n"
        "t = threading.Thread(target=s.start); t.start(); t.join()\n"
        "time.sleep(0.3)\n"
        "assert s.healthy(), 'server died with its starting thread'\n"
        "print(s.pid, s.directory, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    directory = None
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30.0)
        assert ready, "child did not start etcd in 30s"
        line = proc.stdout.readline()
        assert line, f"child failed: {proc.stderr.read() if proc.stderr else ''}"
        pid_text, directory = line.split()
        server_pid = int(pid_text)
        assert _pid_alive(server_pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        _wait_for(lambda: not _pid_alive(server_pid), 5.0, "etcd to die with its parent")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        if directory:  # a SIGKILLed owner cannot clean up its temp dir
            shutil.rmtree(directory, ignore_errors=True)


# -- MariaDB -------------------------------------------------------------------


def test_mariadb_crash_and_restart_keep_data(fresh_mariadb: MariaDBServer) -> None:
    db = fresh_mariadb
    assert db.dsn == f"mysql://root@127.0.0.1:{db.port}/aioelect_test"
    assert db.query("SELECT 1") == [(1,)]
    db.query("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
    db.query("INSERT INTO t VALUES (%s, %s)", (1, "one"))

    old_pid, port = db.pid, db.port
    db.kill()
    assert not db.running
    with pytest.raises(pymysql.err.MySQLError):
        db.query("SELECT 1", timeout=1)
    db.start()
    assert db.pid != old_pid and db.port == port
    assert db.query("SELECT v FROM t") == [("one",)]

    db.restart()
    assert db.port == port
    assert db.query("SELECT v FROM t WHERE id = %s", (1,)) == [("one",)]


def test_mariadb_freeze_thaw_users_and_connections(fresh_mariadb: MariaDBServer) -> None:
    db = fresh_mariadb
    dsn = db.create_user("alice", "s3cr@t")
    assert dsn == f"mysql://alice:s3cr%40t@127.0.0.1:{db.port}/aioelect_test"
    conn = pymysql.connect(
        host=db.host, port=db.port, user="alice", password="s3cr@t", database="aioelect_test", read_timeout=5
    )
    try:
        assert len(db.connection_ids("alice")) == 1

        db.freeze()
        assert db.frozen
        started = time.monotonic()
        with pytest.raises(pymysql.err.MySQLError):
            db.query("SELECT 1", timeout=1)
        assert time.monotonic() - started < 5
        db.thaw()
        assert db.query("SELECT 1") == [(1,)]

        assert db.kill_connections("alice") == 1
        with pytest.raises(pymysql.err.MySQLError), conn.cursor() as cur:
            cur.execute("SELECT 1")
        assert db.connection_ids("alice") == []
    finally:
        conn.close()


# -- etcd ----------------------------------------------------------------------


def test_etcd_put_get_freeze_kill(fresh_etcd: EtcdServer) -> None:
    etcd = fresh_etcd
    assert etcd.endpoints == [etcd.endpoint] == [f"127.0.0.1:{etcd.port}"]
    etcd.etcdctl("put", "k", "v", check=True)
    assert etcd.etcdctl("get", "k", "--print-value-only", check=True).stdout.strip() == "v"
    with urllib.request.urlopen(etcd.metrics_url, timeout=5) as resp:
        assert b"etcd_server_has_leader 1" in resp.read()

    etcd.freeze()
    try:
        result = etcd.etcdctl("get", "k", timeout=2)
        assert result.returncode != 0
    except subprocess.TimeoutExpired:
        pass
    etcd.thaw()
    assert etcd.etcdctl("get", "k", "--print-value-only", check=True).stdout.strip() == "v"

    etcd.kill()
    assert not etcd.healthy(timeout=0.5)
    etcd.start()
    assert etcd.etcdctl("get", "k", "--print-value-only", check=True).stdout.strip() == "v"


def test_etcd_cluster_serves_with_one_member_down(etcd_cluster: EtcdCluster) -> None:
    cluster = etcd_cluster
    assert len(cluster.members) == 3 and len(set(cluster.endpoints)) == 3
    cluster.etcdctl("put", "k", "v", check=True)
    leader = cluster.leader()
    assert leader is not None

    leader.kill()  # worst case: the leader goes; the other two elect a new one
    survivors = [m for m in cluster.members if m is not leader]
    survivor = survivors[0]
    _wait_for(lambda: survivor.etcdctl("put", "k2", "v2", timeout=3).returncode == 0, 15.0, "a write after failover")
    for member in survivors:
        assert member.etcdctl("get", "k", "--print-value-only", check=True).stdout.strip() == "v"
    new_leader = cluster.leader()
    assert new_leader is not None and new_leader is not leader

    leader.start()  # rejoins with its data
    assert leader.healthy()
    assert leader.etcdctl("get", "k2", "--print-value-only", check=True).stdout.strip() == "v2"


# -- PostgreSQL ----------------------------------------------------------------


def test_postgres_query_freeze_kill(fresh_postgres: PostgresServer) -> None:
    pg = fresh_postgres
    assert pg.dsn == f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
    assert pg.query("SELECT $1::int + 1", [41]) == [(42,)]
    pg.query("CREATE TABLE t (v text)")
    pg.query("INSERT INTO t VALUES ($1)", ["kept"])

    pg.freeze()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        pg.query("SELECT 1", timeout=1)
    assert time.monotonic() - started < 5
    pg.thaw()
    assert pg.query("SELECT 1") == [(1,)]

    pg.kill()
    pg.start()
    assert pg.query("SELECT v FROM t") == [("kept",)]


# -- session fixtures --------------------------------------------------------------


def test_session_fixtures(mysql_dsn: str, etcd_endpoints: list[str], postgres_dsn: str) -> None:
    assert mysql_dsn.startswith("mysql://")
    assert etcd_endpoints and all(":" in e for e in etcd_endpoints)
    assert postgres_dsn.startswith("postgresql://")


# -- TCP proxy -------------------------------------------------------------------


def _connect(port: int, timeout: float = 1.0) -> Any:
    return pymysql.connect(
        host="127.0.0.1",
        port=port,
        user="root",
        connect_timeout=timeout,
        read_timeout=timeout,
        write_timeout=timeout,
        autocommit=True,
    )


def _select(conn: Any) -> Any:
    with conn.cursor() as cur:
        cur.execute("SELECT 1")
        return cur.fetchone()


def test_proxy_passthrough_stall_drop(
    mariadb: MariaDBServer, tcp_proxy_factory: Callable[[str, int], TCPProxy]
) -> None:
    proxy = tcp_proxy_factory(mariadb.host, mariadb.port)
    assert proxy.address == ("127.0.0.1", proxy.port) and proxy.mode == "passthrough"

    active, idle = _connect(proxy.port), _connect(proxy.port)
    try:
        assert _select(active) == (1,) and _select(idle) == (1,)
        assert proxy.connection_count == 2

        # stall: open connections stay open but nothing moves; new ones hang
        proxy.stall()
        with pytest.raises(pymysql.err.MySQLError):
            _select(active)
        with pytest.raises(pymysql.err.MySQLError):
            _connect(proxy.port)
        proxy.heal()
        assert _select(idle) == (1,)  # survived the partition
        fresh = _connect(proxy.port)
        assert _select(fresh) == (1,)

        # drop: existing connections are reset, new ones too, until healed
        proxy.drop()
        with pytest.raises(pymysql.err.MySQLError):
            _select(fresh)
        with pytest.raises(pymysql.err.MySQLError):
            _connect(proxy.port)
        assert proxy.connection_count == 0
        proxy.passthrough()
        again = _connect(proxy.port)
        assert _select(again) == (1,)
        again.close()
    finally:
        for conn in (active, idle):
            with contextlib.suppress(Exception):
                conn.close()


@contextlib.contextmanager
def _proxied() -> Iterator[tuple[TCPProxy, socket.socket, socket.socket]]:
    """A proxy to a plain listening socket: (proxy, client end, upstream end), all closed afterwards."""
    with socket.create_server(("127.0.0.1", 0)) as server, TCPProxy("127.0.0.1", server.getsockname()[1]) as proxy:
        client = socket.create_connection(proxy.address, timeout=5)
        upstream, _ = server.accept()
        with client, upstream:
            upstream.settimeout(5)
            yield proxy, client, upstream


def test_proxy_stall_from_silences_one_client_address_only() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, TCPProxy("127.0.0.1", server.getsockname()[1]) as proxy:
        near = socket.create_connection(proxy.address, timeout=5)
        far = socket.create_connection(proxy.address, timeout=5, source_address=("127.0.0.2", 0))
        ends = [server.accept()[0] for _ in range(2)]
        with near, far, ends[0], ends[1]:
            proxy.stall_from("127.0.0.2")
            near.sendall(b"near")
            far.sendall(b"far!")
            got = {}
            for end in ends:
                end.settimeout(0.5)
                with contextlib.suppress(TimeoutError):
                    got[end] = end.recv(4)
            assert sorted(got.values()) == [b"near"], got
            proxy.heal()
            silent = next(end for end in ends if end not in got)
            silent.settimeout(5)
            assert silent.recv(4) == b"far!"  # held, not lost


def test_proxy_close_resets_clients() -> None:
    with _proxied() as (proxy, client, upstream):
        client.sendall(b"ping")
        assert upstream.recv(4) == b"ping"
        upstream.sendall(b"pong")
        assert client.recv(4) == b"pong"
        proxy.close()
        assert proxy.connection_count == 0
        try:
            data = client.recv(4)
        except ConnectionResetError:
            data = b""
        assert data == b""


def test_proxy_delay_holds_each_chunk_and_heal_releases_what_is_held() -> None:
    with _proxied() as (proxy, client, upstream):
        proxy.delay(0.3)
        assert proxy.delay_seconds == 0.3 and proxy.mode == "passthrough"
        sent = time.monotonic()
        client.sendall(b"one")
        client.sendall(b"two")
        got = b""
        while len(got) < 6:
            got += upstream.recv(6)
        assert got == b"onetwo"
        took = time.monotonic() - sent
        assert 0.25 <= took < 2.0, f"a 0.3 s delay forwarded after {took:.3f} s"
        upstream.sendall(b"back")
        sent = time.monotonic()
        assert client.recv(4) == b"back"
        assert 0.25 <= time.monotonic() - sent < 2.0
        # Bytes held when the delay ends go at once; then nothing is held back.
        proxy.delay(30.0)
        client.sendall(b"held")
        time.sleep(0.1)
        proxy.heal()
        assert proxy.delay_seconds == 0.0
        sent = time.monotonic()
        assert upstream.recv(4) == b"held" and time.monotonic() - sent < 1.0
        # The end of the stream waits for the bytes held before it.
        proxy.delay(0.3)
        client.sendall(b"last")
        client.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := upstream.recv(16):
            got += chunk
        assert got == b"last"


def test_namespaces_split_two_nodes_while_this_process_reaches_both() -> None:
    """A cut drops the packets between two nodes (a connection attempt times out, nothing refuses it); this
    process still reaches both; after the heal the nodes reach each other again."""
    from .harness.netns import Namespaces

    nets = Namespaces(2)
    try:
        a, b = nets.nodes
        server = RedisServer()
        server.place(b)
        try:
            server.start()

            def from_a() -> int:
                probe = f"exec 3<>/dev/tcp/{b.address}/{server.port}"
                argv = [*a.prefix, "timeout", "2", "bash", "-c", probe]
                return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode

            assert from_a() == 0
            nets.cut(a, b)
            assert from_a() == 124, "the cut should drop the packets (the probe times out)"
            assert server.command("PING") == "PONG"  # this process still reaches the node
            nets.heal(a, b)
            assert from_a() == 0
        finally:
            server.cleanup()
    finally:
        nets.cleanup()


def test_namespaces_split_one_port_between_two_nodes_and_leave_the_rest() -> None:
    """A cut on a port drops the TCP packets to and from that port only (a Cluster's bus, not its clients'
    connections): a connection from one node to that port of the other times out, one to another port of the
    same node goes through; after the heal both go through."""
    from .harness.netns import Namespaces

    nets = Namespaces(2)
    try:
        a, b = nets.nodes
        servers = [RedisServer(), RedisServer()]
        try:
            for server in servers:
                server.place(b)
                server.start()
            cut, kept = servers

            def from_a(server: RedisServer) -> int:
                probe = f"exec 3<>/dev/tcp/{b.address}/{server.port}"
                argv = [*a.prefix, "timeout", "2", "bash", "-c", probe]
                return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode

            nets.cut(a, b, port=cut.port)
            assert nets.cuts == {(a.index, b.index)}
            assert from_a(cut) == 124, "the cut should drop the packets to that port (the probe times out)"
            assert from_a(kept) == 0, "another port of the same node should still be reached"
            assert cut.command("PING") == "PONG"  # this process still reaches the node on every port
            nets.heal_all()
            assert nets.cuts == set()
            assert from_a(cut) == 0
        finally:
            for server in servers:
                server.cleanup()
    finally:
        nets.cleanup()


# -- a deep TMPDIR ---------------------------------------------------------------


@pytest.mark.parametrize("server", [MariaDBServer, PostgresServer])
def test_a_server_starts_under_a_temporary_directory_too_deep_for_a_socket_path(
    server: type[MariaDBServer | PostgresServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Unix socket's path holds at most 107 bytes: a server under a deep TMPDIR (a test's tmp_path under xdist)
    puts its socket in a short directory of its own, and removes that directory on cleanup."""
    top = tempfile.mkdtemp(prefix="aioelect-deep-", dir="/tmp")
    try:
        os.chmod(top, 0o755)  # postgres runs as its own user
        deep = os.path.join(top, "d" * (100 - len(top)))
        os.mkdir(deep)
        monkeypatch.setattr("tempfile.tempdir", deep)
        with server() as started:
            assert started.directory.startswith(deep)
            assert len(started.socket_dir) <= 80
            assert started.query("SELECT 1") == [(1,)]
            short = started.socket_dir
        assert not os.path.exists(short)
    finally:
        shutil.rmtree(top, ignore_errors=True)
