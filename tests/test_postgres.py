"""The PostgreSQL advisory-lock backend, on throwaway servers from the harness.

Contract behaviour in process, then faults with real candidate processes
(tests/candidates/candidate.py): SIGKILL, SIGSTOP longer than the lease,
pg_terminate_backend, and a server restart.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from aioelect import (
    BackendUnavailable,
    ElectionError,
    Elector,
    Leadership,
    LeadershipLost,
    LossKind,
    PermanentBackendError,
    PostgresElector,
    leadership,
)
from aioelect.backends.sql.postgres import KEY_SQL, PostgresBackend, advisory_key, application_name, lock_ids
from aioelect.core._elector import backend_of
from soak.checker import NS, Term

from .backends import Follower, handover_delays, unique_name, with_database
from .faults import CANDIDATE, EventProcess, judge_terms
from .harness import Certificates, MissingBinaryError, PgBouncer, PostgresServer, free_port
from .harness.plugin import server_unavailable
from .session_locks import losing_its_first_grant, unconfirmed_release

FAST: dict[str, Any] = {"check_interval": 0.2, "check_timeout": 1.0, "lease": 4, "poll_interval": 0.5}
#: Options of the candidate processes in the fault tests.
LEASE = 3.0
FAULT_OPTIONS: dict[str, Any] = {
    "lease": LEASE,
    "check_interval": 0.3,
    "check_timeout": 0.6,
    "renew_deadline": 2.0,
    "poll_interval": 1.0,
    "fencing": True,
}
#: Scheduling slack on a shared two-core machine.
MARGIN = 2.0


def make(dsn: str, name: str, identity: str | None = None, **kw: Any) -> PostgresElector:
    return PostgresElector(dsn, name=name, identity=identity, **{**FAST, **kw})


@pytest.fixture
async def admin(postgres_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(postgres_dsn, timeout=10, server_settings={"application_name": "test-admin"})
    try:
        yield conn
    finally:
        await conn.close(timeout=5)


async def client_backends(admin: asyncpg.Connection) -> int:
    """Client sessions other than the admin's own."""
    return int(
        await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
    )


async def holder_pid(admin: asyncpg.Connection, name: str) -> int | None:
    classid, objid = lock_ids(advisory_key(name))
    pid = await admin.fetchval(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 "
        "AND objsubid = 1 AND granted",
        classid,
        objid,
    )
    return int(pid) if pid is not None else None


# --- key and options -------------------------------------------------------------------


async def test_key_is_the_documented_hash(admin: asyncpg.Connection, postgres_dsn: str) -> None:
    for name in ("aioelect/leader", "x", unique_name()):
        assert advisory_key(name) == await admin.fetchval(KEY_SQL, name)
    assert advisory_key("aioelect/leader") == -2364074322213752930  # fixed forever: other languages rely on it
    for key in (-5, 7, advisory_key("aioelect/leader"), 2**63 - 1, -(2**63)):
        await admin.execute("SELECT pg_advisory_lock($1)", key)
        row = await admin.fetchrow(
            "SELECT classid, objid, objsubid FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        await admin.execute("SELECT pg_advisory_unlock($1)", key)
        assert (row["classid"], row["objid"], row["objsubid"]) == (*lock_ids(key), 1)


def test_bad_input_raises_value_error() -> None:
    dsn = "postgresql://u:s3cret-pw@127.0.0.1:5/db"
    bad: list[tuple[dict[str, Any], str]] = [
        ({"dsn": "mysql://u@h/db"}, "scheme"),
        ({"dsn": "nonsense"}, "postgresql://"),
        ({}, "needs a dsn or a host"),
        ({"dsn": dsn, "port": 0}, "port"),
        ({"dsn": dsn, "port": True}, "port"),
        ({"dsn": dsn + "?sslmode=sometimes"}, "sslmode"),
        ({"dsn": dsn + "?target_session_attrs=any"}, "unsupported DSN parameter"),
        ({"dsn": dsn, "ssl": 3}, "ssl"),
        ({"dsn": dsn, "lease": 0.5}, "at least 1 second"),
        ({"dsn": dsn, "lease": True}, "lease"),
        ({"dsn": dsn, "lease": 4, "renew_deadline": 4}, "shorter than lease"),
        ({"dsn": dsn, "check_interval": 2, "check_timeout": 2, "lease": 5}, "would fence itself"),
        ({"dsn": dsn, "poll_interval": 0}, "poll_interval"),
        ({"dsn": dsn, "connect_timeout": -1}, "connect_timeout"),
        ({"dsn": dsn, "name": ""}, "name"),
        ({"dsn": dsn, "name": "a b"}, "name"),
        ({"dsn": dsn, "identity": "x" * 200}, "identity"),
        ({"dsn": dsn, "fencing": "yes"}, "fencing"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message) as info:
            PostgresElector(**{"name": "t", **kwargs})
        assert "s3cret" not in str(info.value)
    elector = PostgresElector(dsn, name="ok", identity="me")
    assert "s3cret" not in repr(elector) and "s3cret" not in elector._backend.describe_timing()
    # postgres:// works too; keyword arguments override the DSN's parts.
    assert PostgresElector(
        "postgres://h/db", port=6000, lease=2.5, check_interval=0.5, check_timeout=0.6, name="t"
    ).name


def test_application_name_is_cut_at_63_bytes() -> None:
    assert application_name("a" * 100) == "a" * 63
    assert application_name("short") == "short"


# --- contract --------------------------------------------------------------------------


async def test_acquire_release_reacquire_and_identity(postgres_dsn: str, admin: asyncpg.Connection) -> None:
    name = unique_name("pg")
    long_identity = "host.example:1234:" + "x" * 80
    async with (
        make(postgres_dsn, name, long_identity, fencing=True, schema="public") as a,
        make(postgres_dsn, name, "w", schema="public") as w,
    ):
        tokens = []
        for _ in range(3):
            lead = await a.acquire()
            tokens.append(lead.token)
            assert lead.held
            with pytest.raises(ElectionError):
                await a.acquire()
            pid = await holder_pid(admin, name)
            app = await admin.fetchval("SELECT application_name FROM pg_stat_activity WHERE pid = $1", pid)
            assert app == long_identity[:63]
            assert await w.leader() == long_identity  # the fencing table has the full identity
            await lead.release()
            await lead.release()
            assert not lead.held and not lead.lost
            assert await w.leader() is None
            assert await holder_pid(admin, name) is None
        # Transaction ids: strictly increasing, not consecutive.
        assert tokens[0] is not None and tokens == sorted(set(tokens))
        row = await admin.fetchrow("SELECT token, holder FROM public.aioelect_leaders WHERE name = $1", name)
        assert (row["token"], row["holder"]) == (tokens[-1], long_identity)


async def test_leader_without_fencing_reports_application_name(postgres_dsn: str) -> None:
    name = unique_name("pg")
    async with (
        make(postgres_dsn, name, "y" * 100, fencing=False) as a,
        make(postgres_dsn, name, "w", fencing=False) as w,
    ):
        lead = await a.acquire()
        assert lead.token is None
        assert await w.leader() == "y" * 63
        await lead.release()


async def test_takeover_after_release_under_100ms(postgres_dsn: str) -> None:
    name = unique_name("pg")
    async with (
        make(postgres_dsn, name, "a", fencing=True, poll_interval=2.0) as a,
        make(postgres_dsn, name, "b", fencing=True, poll_interval=2.0) as b,
    ):
        with anyio.fail_after(60):
            # The other one waits inside pg_advisory_lock.
            delays = await handover_delays(a, b, rounds=12, pause=(0.2, 0.4), consecutive=False)
    median = statistics.median(delays)
    print(f"postgres takeover after release: median {median * 1000:.1f} ms, max {max(delays) * 1000:.1f} ms")
    assert median < 0.1, delays


async def test_a_follower_that_waited_long_keeps_the_leadership_it_wins(
    postgres_dsn: str, admin: asyncpg.Connection
) -> None:
    # poll_interval just under renew_deadline (0.7 * lease = 2.8 s): the winner waited about
    # 2.5 s inside pg_advisory_lock. Its leadership is dated from a confirmation sent after
    # the grant, so it keeps it past 2.8 s after its request was sent.
    name = unique_name("pg")
    slow: dict[str, Any] = {"lease": 4, "check_interval": 0.7, "check_timeout": 1.0, "poll_interval": 2.7}
    async with make(postgres_dsn, name, "first", **slow) as a, make(postgres_dsn, name, "patient", **slow) as b:
        lead_a = await a.acquire()
        follower = Follower(b)  # campaigns in a task of its own, which keeps what it wins
        try:
            with anyio.fail_after(10):
                while not await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'patient' "
                    "AND wait_event_type = 'Lock'"
                ):
                    await asyncio.sleep(0.01)
            waiting = time.monotonic()
            await asyncio.sleep(2.5)
            await lead_a.release()
            lead_b = await follower.wait()
            await asyncio.sleep(max(0.0, waiting + 2.8 + 1.5 - time.monotonic()))
            assert lead_b.held and not lead_b.lost, f"lost after winning: {lead_b.lost_reason}"
            assert time.monotonic() - waiting > 4.0
        finally:
            await follower.close()


async def test_cancelled_acquire_leaves_no_backend(postgres_dsn: str, admin: asyncpg.Connection) -> None:
    name = unique_name("pg")
    async with make(postgres_dsn, name, "leader", poll_interval=30) as a:
        lead = await a.acquire()
        baseline = await client_backends(admin)
        for i in range(3):
            async with make(postgres_dsn, name, f"waiter-{i}", poll_interval=30) as b:
                task = asyncio.create_task(b.acquire())
                with anyio.fail_after(10):
                    while not await admin.fetchval(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE application_name = $1 AND wait_event_type = 'Lock'",
                        f"waiter-{i}",
                    ):
                        await asyncio.sleep(0.02)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # Gone as soon as the cancelled acquire returns: not waiting until lock_timeout (30 s).
                assert not await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", f"waiter-{i}"
                )
                assert not b.leading
        with anyio.fail_after(5):  # the short-lived cleanup connection ends asynchronously
            while await client_backends(admin) != baseline:
                await asyncio.sleep(0.05)
        assert lead.held and await holder_pid(admin, name) is not None
        await lead.release()
    with anyio.fail_after(5):
        while await client_backends(admin) != baseline - 1:
            await asyncio.sleep(0.05)


# --- errors ----------------------------------------------------------------------------


async def test_unknown_database_is_permanent(postgres_dsn: str) -> None:
    dsn = with_database(postgres_dsn, "no_such_db_" + unique_name("x").replace("-", "_"))
    async with make(dsn, unique_name("pg")) as elector:
        started = time.monotonic()
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="3D000"):
            await elector.acquire()
        assert time.monotonic() - started < 3, "a permanent error must not be retried"
        with pytest.raises(PermanentBackendError, match="3D000"):
            await elector.leader()


@pytest.fixture
def password_role(postgres: PostgresServer) -> tuple[str, str]:
    """A role that must log in with a password (scram), on the session server."""
    role, password = "aioelect_pw", "right-Pass-1"
    hba = Path(postgres.data_dir) / "pg_hba.conf"
    rule = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
    content = hba.read_text()
    if rule not in content:
        hba.write_text(rule + content)
    postgres.query(
        f"DO $$ BEGIN CREATE ROLE {role} LOGIN PASSWORD '{password}'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    postgres.query("SELECT pg_reload_conf()")
    return role, password


async def wait_for_scram(postgres: PostgresServer, role: str) -> None:
    """pg_reload_conf() is asynchronous: return once a wrong password is refused."""
    while True:
        try:
            conn = await asyncpg.connect(
                host=postgres.host, port=postgres.port, user=role, password="wrong", database="postgres", timeout=5
            )
        except asyncpg.InvalidPasswordError:
            return
        await conn.close()
        await asyncio.sleep(0.05)


async def test_wrong_password_is_permanent(postgres: PostgresServer, password_role: tuple[str, str]) -> None:
    role, password = password_role
    common: dict[str, Any] = {"host": postgres.host, "port": postgres.port, "user": role, "database": "postgres"}
    with anyio.fail_after(10):
        await wait_for_scram(postgres, role)
    name = unique_name("pg")
    async with PostgresElector(**common, password="wrong-Pass-2", name=name, **FAST) as elector:
        started = time.monotonic()
        with anyio.fail_after(10), pytest.raises(PermanentBackendError) as info:
            await elector.acquire()
        assert time.monotonic() - started < 3, "a permanent error must not be retried"
        assert "28P01" in str(info.value) and "wrong-Pass" not in str(info.value)
    async with PostgresElector(**common, password=password, name=name, **FAST) as elector:
        lead = await elector.acquire()  # the right password works, without fencing
        await lead.release()
    # Fencing tokens need no privilege; a leaders table in schema public (no CREATE there on
    # PostgreSQL 15, or a table another role owns) is refused at once, not retried.
    async with PostgresElector(**common, password=password, name=name, fencing=True, **FAST) as elector:
        lead = await elector.acquire()
        assert lead.token is not None
        await lead.release()
    async with PostgresElector(**common, password=password, name=name, schema="public", **FAST) as elector:
        started = time.monotonic()
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="schema=None"):
            await elector.acquire()
        assert time.monotonic() - started < 3, "a permanent error must not be retried"


async def test_unreachable_server(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    async with make(f"postgresql://postgres@127.0.0.1:{port}/postgres", unique_name("pg"), connect_timeout=1) as e:
        with pytest.raises(BackendUnavailable, match=str(port)):
            await e.leader()
        caplog.set_level(logging.WARNING, logger="aioelect")
        with anyio.move_on_after(1.0) as scope:
            await e.acquire()  # transient: retried with backoff, not raised
        assert scope.cancelled_caught
        assert any("retrying" in r.getMessage() for r in caplog.records)


# --- TLS and secrets ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_postgres() -> Iterator[tuple[PostgresServer, Certificates]]:
    """A private server with ``ssl=on`` (pg_hba still trusts plain connections too)."""
    try:
        certs = Certificates()
        server = PostgresServer()
    except MissingBinaryError as exc:
        server_unavailable(str(exc))
    try:
        # PostgreSQL refuses a key that others can read: give the server its own copy.
        key = os.path.join(server.directory, "server-key.pem")
        shutil.copyfile(certs.server_key, key)
        os.chmod(key, 0o600)
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(key, account.pw_uid, account.pw_gid)
        server.extra_args += ["-c", "ssl=on", "-c", f"ssl_cert_file={certs.server_cert}", "-c", f"ssl_key_file={key}"]
        server.start()
        yield server, certs
    finally:
        server.cleanup()
        certs.cleanup()


async def test_tls_verify_full_elects_and_a_wrong_ca_is_permanent(
    tls_postgres: tuple[PostgresServer, Certificates],
) -> None:
    server, certs = tls_postgres
    base = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    async with make(f"{base}?sslmode=verify-full&sslrootcert={certs.ca}", unique_name("pg"), "tls-leader") as e:
        lead = await e.acquire()
        assert await e.leader() == "tls-leader"
        rows = server.query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
            ["tls-leader"],
        )
        assert rows == [(True,)], "the lock session must be encrypted"
        await lead.release()
    async with make(f"{base}?sslrootcert={certs.other_ca}", unique_name("pg")) as e:
        started = time.monotonic()
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="TLS handshake failed"):
            await e.acquire()
        assert time.monotonic() - started < 3, "a refused certificate must not be retried"


def test_bad_tls_options() -> None:
    with pytest.raises(ValueError, match="does not exist"):
        PostgresElector("postgresql://u@127.0.0.1/db?sslrootcert=/no/such/ca.pem", name="t")
    with pytest.raises(ValueError, match="cannot load the root certificate"):
        PostgresElector("postgresql://u@127.0.0.1/db?sslmode=prefer&sslrootcert=/etc/hostname", name="t")
    with pytest.raises(ValueError, match="sslmode"):
        PostgresElector("postgresql://u@127.0.0.1/db", ssl="sometimes", name="t")


async def test_password_never_appears_in_logs_reprs_or_errors(
    postgres: PostgresServer, password_role: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    role, password = password_role
    caplog.set_level(logging.DEBUG, logger="aioelect")
    good = f"postgresql://{role}:{password}@127.0.0.1:{postgres.port}/postgres"
    seen: list[str] = []
    for target in (good, good.replace(password, password + "-wrong")):
        with anyio.fail_after(15):
            await wait_for_scram(postgres, role)
            async with make(target, unique_name("pg"), "secretive") as elector:
                seen.append(repr(elector))
                try:
                    lead = await elector.acquire()
                    seen += [repr(lead), str(await elector.leader())]
                    await lead.release()
                except ElectionError as exc:
                    seen += [str(exc), repr(exc)]
    seen.append(caplog.text)
    seen.extend(repr(r.__dict__) for r in caplog.records)
    text = "\n".join(seen)
    assert "28P01" in text and "secretive" in text  # both the failure and the success were captured...
    assert password not in text  # ...and the password never was


# --- faults on the leader's session ------------------------------------------------------


async def test_terminated_backend_is_a_loss(postgres_dsn: str, admin: asyncpg.Connection) -> None:
    name = unique_name("pg")
    async with make(postgres_dsn, name, "victim", fencing=True) as a, make(postgres_dsn, name, "heir") as b:
        successor: list[Leadership] = []

        async def follow() -> None:
            successor.append(await b.acquire())
            await asyncio.sleep(3600)

        async with anyio.create_task_group() as tg:
            with pytest.raises(LeadershipLost) as info:
                async with leadership(a) as lead:
                    tg.start_soon(follow)
                    await asyncio.sleep(0.2)
                    pid = await holder_pid(admin, name)
                    # Timed from before the call: the loss can cancel this body before the call returns.
                    terminated = time.monotonic()
                    assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
                    await asyncio.sleep(30)
            took = time.monotonic() - terminated
            print(f"postgres loss noticed {took * 1000:.1f} ms after pg_terminate_backend")
            assert took < FAST["check_interval"] + FAST["check_timeout"], f"loss noticed after {took:.2f}s"
            # Mostly "the server closed the lock connection"; a check cut off by the close reads as the driver's
            # error on it (asyncpg: at times an InternalClientError): a lost connection either way.
            assert lead.lost and not lead.held and info.value.kind is LossKind.CONNECTION_LOST, info.value.reason
            with anyio.fail_after(5):
                while not successor:
                    await asyncio.sleep(0.01)
            assert successor[0].held and await a.leader() == "heir"
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("reused", [False, True], ids=["first-session", "reused-session"])
async def test_terminated_session_is_noticed_at_once(
    postgres_dsn: str, admin: asyncpg.Connection, reused: bool
) -> None:
    """The server ending the lock session ends the leadership at once, long before the next check is due.

    Also on a session kept from the elector's previous leadership.
    """
    slow = {"check_interval": 5.0, "check_timeout": 4.0, "lease": 20}
    name = unique_name("pg")
    async with make(postgres_dsn, name, "victim", **slow) as elector:
        if reused:
            first = await elector.acquire()
            kept = await holder_pid(admin, name)
            await first.release()
        lead = await elector.acquire()
        pid = await holder_pid(admin, name)
        assert pid is not None
        if reused:
            assert pid == kept, "the second leadership runs on the kept session"
        await asyncio.sleep(0.2)
        terminated = time.monotonic()
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        with anyio.move_on_after(1.0):
            await lead.wait_lost()
        took = time.monotonic() - terminated
        print(f"postgres loss ({reused=}) noticed {took * 1000:.1f} ms after pg_terminate_backend")
        assert lead.lost and not lead.held, f"loss not seen {took:.2f}s after pg_terminate_backend (check due at 5s)"
        assert "closed" in (lead.lost_reason or "") and lead.lost_kind is LossKind.CONNECTION_LOST
        await lead.release()


@pytest.mark.parametrize("attempt", range(3))
async def test_a_terminated_leader_is_lost_before_a_waiting_candidate_leads(
    postgres_dsn: str, admin: asyncpg.Connection, attempt: int
) -> None:
    """pg_terminate_backend frees the session's lock before its socket closes, and a waiting candidate takes it at
    once: the leader's loss is seen from the server's FATAL message, which comes before the lock is freed."""
    slow = {"check_interval": 5.0, "check_timeout": 4.0, "lease": 20, "poll_interval": 0.3}
    name = unique_name("pg")
    seen: list[bool] = []
    async with make(postgres_dsn, name, "A", **slow) as a, make(postgres_dsn, name, "B", **slow) as b:
        la = await a.acquire()

        async def follow() -> None:
            lb = await b.acquire()
            seen.append(la.held)  # A's leadership, the moment B's starts
            await lb.release()

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await asyncio.sleep(0.5)  # B waits on the lock
            pid = await holder_pid(admin, name)
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
            with anyio.fail_after(10):
                while not seen:
                    await asyncio.sleep(0.01)
        assert seen == [False], "A still led when B took the lock: two leaders"
        assert la.lost_kind is LossKind.CONNECTION_LOST
        await la.release()


async def test_server_restart_leaves_exactly_one_leader(fresh_postgres: PostgresServer) -> None:
    dsn = fresh_postgres.dsn
    name = unique_name("pg")
    electors = [make(dsn, name, f"cand-{i}", fencing=True, poll_interval=0.5) for i in range(3)]
    terms: list[Term] = []
    losses: list[str] = []

    async def candidate(elector: Elector) -> None:
        while True:
            try:
                async with leadership(elector) as lead:
                    start = time.monotonic_ns()
                    try:
                        while True:
                            lead.check()
                            await asyncio.sleep(0.02)
                    finally:
                        terms.append(Term(elector.identity, lead.token or 0, start, time.monotonic_ns(), 0))
            except LeadershipLost as exc:
                losses.append(exc.reason)

    try:
        async with anyio.create_task_group() as tg:
            for elector in electors:
                tg.start_soon(candidate, elector)
            with anyio.fail_after(10):
                while not any(e.leading for e in electors):
                    await asyncio.sleep(0.02)
            await anyio.to_thread.run_sync(fresh_postgres.restart)
            with anyio.fail_after(15):
                while not losses:
                    await asyncio.sleep(0.02)
                while sum(e.leading for e in electors) != 1:
                    await asyncio.sleep(0.02)
            await asyncio.sleep(1.5)  # stays one leader
            assert sum(e.leading for e in electors) == 1
            leading = next(e for e in electors if e.leading)
            assert await leading.leader() == leading.identity
            tg.cancel_scope.cancel()
    finally:
        for elector in electors:
            await elector.aclose()
    assert len(terms) >= 2, terms
    # A shutdown ends the sessions one at a time: a waiting candidate can be granted the
    # lock the moment the leader's session ends, milliseconds before the leader has seen
    # its connection close. Such terms may overlap by that much, never more, and the
    # fencing token orders them.
    judge_terms(terms, margin=0.2)


# --- faults on candidate processes ---------------------------------------------------


class Proc(EventProcess):
    """One candidate.py process on PostgreSQL."""

    def __init__(self, dsn: str, name: str, identity: str) -> None:
        super().__init__(
            CANDIDATE,
            "--backend=postgres",
            f"--target={dsn}",
            f"--name={name}",
            f"--identity={identity}",
            f"--options={json.dumps(FAULT_OPTIONS)}",
            identity=identity,
        )

    def acting(self, within: float = 0.3) -> bool:
        acts = [e for e in self.events if e["event"] == "tick" and e["held"]]
        return bool(acts) and time.monotonic() - acts[-1]["t"] < within


async def wait_single_leader(procs: list[Proc], timeout: float, exclude: Proc | None = None) -> Proc:
    with anyio.fail_after(timeout):
        while True:
            acting = [p for p in procs if p is not exclude and p.acting()]
            if len(acting) == 1:
                return acting[0]
            await asyncio.sleep(0.01)


def terms_of(procs: list[Proc]) -> list[Term]:
    """Every leadership: who read ``held`` True under one token, from the first such read to the last."""
    spans: dict[tuple[str, int], list[float]] = {}
    for p in procs:
        for e in p.events:
            if e["event"] == "tick" and e["held"]:
                spans.setdefault((p.identity, e["token"]), []).append(e["t"])
    return [Term(who, token, round(min(ts) * NS), round(max(ts) * NS), len(ts)) for (who, token), ts in spans.items()]


def check_no_overlap(procs: list[Proc]) -> None:
    judge_terms(terms_of(procs))


async def start_three(postgres_dsn: str, procs: list[Proc]) -> Proc:
    name = unique_name("pgfault")
    procs.extend(Proc(postgres_dsn, name, f"cand-{i}") for i in range(3))
    return await wait_single_leader(procs, timeout=20)


async def test_leader_process_killed_fast_takeover(postgres_dsn: str, procs: list[Proc]) -> None:
    leader = await start_three(postgres_dsn, procs)
    await asyncio.sleep(0.3)
    killed = time.monotonic()
    leader.kill()
    successor = await wait_single_leader(procs, timeout=10, exclude=leader)
    first = min(e["t"] for e in successor.events if e["event"] == "tick" and e["held"] and e["t"] > killed)
    print(f"postgres takeover after SIGKILL: {(first - killed) * 1000:.1f} ms")
    assert first - killed < 1.0, f"takeover after SIGKILL took {first - killed:.2f}s"
    check_no_overlap(procs)


async def _lock_sessions(dsn: str, procs: list[Proc]) -> str:
    """What the server and the candidates show when a takeover is late: each candidate's sessions (state, how long
    in it, the advisory locks they hold or wait for) and its last events, so a failure tells which step stalled."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT a.application_name, a.pid, a.state, a.wait_event_type, "
            "round(extract(epoch FROM now() - a.state_change)::numeric, 2) AS for_s, left(a.query, 60) AS query, "
            "l.granted FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' "
            "WHERE a.application_name LIKE 'cand-%' ORDER BY a.application_name"
        )
    finally:
        await conn.close(timeout=5)
    sessions = "; ".join(str(dict(row)) for row in rows) or "none"
    events = "; ".join(f"{p.identity} (exit {p.proc.poll()}): {p.events[-3:]}" for p in procs)
    return f"sessions: {sessions}; last events: {events}"


async def test_leader_frozen_longer_than_lease(postgres_dsn: str, procs: list[Proc]) -> None:
    leader = await start_three(postgres_dsn, procs)
    # About when the leader sends its first lock check: freezing there once left the session
    # half-way through asyncpg's prepare exchange, where idle_session_timeout never fires.
    await asyncio.sleep(0.3)
    frozen = time.monotonic()
    leader.proc.send_signal(signal.SIGSTOP)
    try:
        try:
            successor = await wait_single_leader(procs, timeout=LEASE + 10, exclude=leader)
        except TimeoutError:
            pytest.fail(f"no successor {LEASE + 10:g}s after the freeze; {await _lock_sessions(postgres_dsn, procs)}")
        took = min(e["t"] for e in successor.events if e["event"] == "tick" and e["held"] and e["t"] > frozen) - frozen
        print(f"postgres takeover of a SIGSTOPped leader: {took:.2f} s (lease {LEASE:g} s)")
        assert took < LEASE + MARGIN, f"takeover of a frozen leader took {took:.2f}s"
        # Stay frozen well past the lease, then wake up.
        await asyncio.sleep(max(0.0, frozen + LEASE + 1.5 - time.monotonic()))
    finally:
        thawed = time.monotonic()
        leader.proc.send_signal(signal.SIGCONT)
    with anyio.fail_after(5):
        while not [e for e in leader.events if e["t"] >= thawed and e["event"] in ("tick", "lost")]:
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)
    after = [e for e in leader.events if e["t"] >= thawed]
    # It may hear of its ended session before its first tick (the server's FATAL, read at once on waking).
    ticks = [e for e in after if e["event"] == "tick"]
    assert ticks and ticks[0]["held"] is False, f"woken leader acted first: {after[:3]}"
    old = ticks[0]["token"]
    assert not [e for e in after if e["event"] == "tick" and e["held"] and e["token"] == old]
    assert any(e["event"] == "lost" for e in after)
    assert successor.acting(), "the successor keeps leading"
    check_no_overlap(procs)


async def test_default_elector_has_a_token(postgres_dsn: str) -> None:
    name = unique_name("pg")
    tokens = []
    async with make(postgres_dsn, name, "quick") as elector:
        for _ in range(2):
            async with leadership(elector) as lead:
                assert lead.token is not None
                tokens.append(lead.token)
    assert tokens[1] > tokens[0]


async def test_try_acquire_never_waits_and_leaves_no_session(postgres_dsn: str, admin: asyncpg.Connection) -> None:
    name = unique_name("pg")
    async with make(postgres_dsn, name, poll_interval=5) as a, make(postgres_dsn, name, poll_interval=5) as b:
        lead = await a.try_acquire()
        assert lead is not None and lead.token is not None

        async def sessions() -> int:
            return int(
                await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid()"
                )
            )

        before = await sessions()
        started = time.monotonic()
        assert await b.try_acquire() is None
        assert time.monotonic() - started < 1.0, "pg_try_advisory_lock must not wait for poll_interval"
        with anyio.fail_after(5):
            while await sessions() != before:
                await asyncio.sleep(0.05)
        await lead.release()


# --- one session across the leaderships of one elector -----------------------------------------


async def backend_gone(admin: asyncpg.Connection, pid: int) -> bool:
    """Whether the server's backend ``pid`` ended within 5 s."""
    with anyio.move_on_after(5):
        while await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
            await asyncio.sleep(0.05)
        return True
    return False


async def test_clean_release_keeps_the_session_for_the_next_campaign(
    postgres_dsn: str, admin: asyncpg.Connection
) -> None:
    name = unique_name("pg")
    async with make(postgres_dsn, name, "kept") as elector:
        lead = await elector.acquire()
        first = await holder_pid(admin, name)
        assert first is not None and lead.token is not None
        token = lead.token
        await lead.release()
        assert await holder_pid(admin, name) is None, "pg_advisory_unlock answered true: the lock is free"
        alive = await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", first)
        assert alive == 1, "the released session is kept for the next campaign"
        lead = await elector.acquire()
        assert await holder_pid(admin, name) == first
        assert lead.token is not None and lead.token > token
        await lead.release()
        assert await holder_pid(admin, name) is None
    assert await backend_gone(admin, first), "aclose() closes the kept session"


async def test_unclear_release_closes_the_session(postgres_dsn: str, admin: asyncpg.Connection) -> None:
    """A release the server does not confirm (pg_advisory_unlock answered false), or a lost session, is not reused."""

    UnconfirmedRelease = unconfirmed_release(PostgresBackend)

    name = unique_name("pg")
    async with Elector(UnconfirmedRelease(postgres_dsn, name=name, **FAST)) as elector:
        lead = await elector.acquire()
        first = await holder_pid(admin, name)
        assert first is not None
        await lead.release()
        assert await holder_pid(admin, name) is None
        assert await backend_gone(admin, first), "an unconfirmed release closes the session"
        lead = await elector.acquire()
        second = await holder_pid(admin, name)
        assert second not in (None, first)
        await admin.fetchval("SELECT pg_terminate_backend($1)", second)
        with anyio.fail_after(5):
            await lead.wait_lost()
        await lead.release()
        lead = await elector.acquire()
        assert await holder_pid(admin, name) not in (None, first, second)
        await lead.release()


async def test_a_kept_session_the_server_ended_is_replaced_at_once(
    postgres_dsn: str, admin: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique_name("pg")
    async with make(postgres_dsn, name, "kept") as elector:
        lead = await elector.acquire()
        first = await holder_pid(admin, name)
        assert first is not None
        await lead.release()
        await admin.fetchval("SELECT pg_terminate_backend($1)", first)
        started = time.monotonic()
        lead = await elector.acquire()
        assert time.monotonic() - started < 1.0, "no backoff: the kept session was merely gone"
        second = await holder_pid(admin, name)
        assert second not in (None, first)
        assert "campaign interrupted" not in caplog.text
        await lead.release()
        # The new session got every setting in its startup packet (the server's version known by now).
        kept = elector._backend.sessions.kept.conn.raw  # type: ignore[attr-defined]
        shown = {
            k: await kept.fetchval(f"SHOW {k}")
            for k in (
                "lock_timeout",
                "idle_session_timeout",
                "idle_in_transaction_session_timeout",
                "client_connection_check_interval",
                "synchronous_commit",
                "search_path",
            )
        }
        assert shown == {
            "lock_timeout": "500ms",
            "idle_session_timeout": "4s",
            "idle_in_transaction_session_timeout": "4s",
            "client_connection_check_interval": "1s",
            "synchronous_commit": "on",
            "search_path": "pg_catalog, pg_temp",
        }
        await admin.fetchval("SELECT pg_terminate_backend($1, 5000)", second)
        tried = await elector.try_acquire()
        assert tried is not None, "try_acquire() replaces a kept session the server ended"
        assert await holder_pid(admin, name) not in (None, first, second)
        await tried.release()


async def test_no_leadership_without_the_check_after_the_grant(
    postgres_dsn: str, admin: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """A grant whose check (the statement that also takes the token) finds the lock not ours is no leadership."""
    caplog.set_level(logging.DEBUG, logger="aioelect")

    LosesItsFirstGrant, lost = losing_its_first_grant(PostgresBackend)

    name = unique_name("pg")
    backend = LosesItsFirstGrant(postgres_dsn, name=name, **FAST)
    try:
        with anyio.fail_after(10):
            hold = await backend.campaign("checked")
        assert lost, "the first grant was taken"
        assert "does not show it held by our session" in caplog.text
        assert await holder_pid(admin, name) not in (None, *lost)
        assert hold.token is not None
        await hold.release()
    finally:
        await backend.aclose()


# --- server-side bounds ------------------------------------------------------------------


async def test_lock_session_keepalives_never_end_it_before_the_lease(postgres_dsn: str) -> None:
    """lease=10, renew_deadline=9: the server must not drop an unreachable leader's session before 10 s.

    Its TCP keepalives end a connection to a client that no longer answers after idle + interval * count:
    that must be at least the lease, or the lock passes on while the cut-off leader still leads.
    """
    async with make(postgres_dsn, unique_name("pg"), "keepalive", lease=10, renew_deadline=9) as elector:
        lead = await elector.acquire()
        await lead.release()
        kept = elector._backend.sessions.kept.conn.raw  # type: ignore[attr-defined]
        rows = await kept.fetch(
            "SELECT name, setting::int FROM pg_catalog.pg_settings WHERE name LIKE 'tcp\\_keepalives\\_%'"
        )
        found = {row[0]: row[1] for row in rows}
        dropped_after = found["tcp_keepalives_idle"] + found["tcp_keepalives_interval"] * found["tcp_keepalives_count"]
        assert dropped_after >= 10, f"keepalives end the session after {dropped_after}s: {found}"


@pytest.fixture
def bounded_role(postgres: PostgresServer) -> Iterator[str]:
    """A login role whose sessions run with tcp_user_timeout = 2 s and idle_session_timeout = 3 s (ALTER ROLE)."""
    role = "aioelect_bounds_" + unique_name("r").replace("-", "_")
    postgres.query(f"CREATE ROLE {role} LOGIN")
    postgres.query(f"ALTER ROLE {role} SET tcp_user_timeout = '2s'")
    postgres.query(f"ALTER ROLE {role} SET idle_session_timeout = '3s'")
    try:
        yield role
    finally:
        postgres.query(
            f"SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity WHERE usename = '{role}'"
        )
        postgres.query(f"DROP ROLE IF EXISTS {role}")


async def test_a_server_bound_shorter_than_the_lease_is_refused_at_connect(
    postgres_dsn: str, bounded_role: str
) -> None:
    """A role's tcp_user_timeout of 2 s would let the server drop a cut-off leader's session before lease=4.

    Refused at once, naming it. The role's idle_session_timeout (3 s) is not what refuses it: the lock
    session's own (lease) overrides it, as pg_settings shows.
    """
    async with make(postgres_dsn, unique_name("pg"), user=bounded_role, fencing=False) as elector:
        started = time.monotonic()
        with (
            anyio.fail_after(10),
            pytest.raises(PermanentBackendError, match=r"2s after .*\(tcp_user_timeout\).*lease \(4s\)"),
        ):
            await elector.acquire()
        assert time.monotonic() - started < 3, "a bound that breaks the timing must not be retried"
    async with make(
        postgres_dsn,
        unique_name("pg"),
        user=bounded_role,
        fencing=False,
        lease=2,
        renew_deadline=0.8,
        check_interval=0.2,
        check_timeout=0.3,
    ) as elector:
        with anyio.fail_after(10):
            lead = await elector.acquire()  # every bound is at least the 2 s lease
        conn = lead._hold._conn.raw  # type: ignore[attr-defined]
        assert await conn.fetchval(
            "SELECT setting FROM pg_catalog.pg_settings WHERE name = 'idle_session_timeout'"
        ) == ("2000")
        await lead.release()


async def test_a_session_is_terminated_only_when_its_pid_and_start_are_the_ones_recorded(
    postgres_dsn: str, admin: asyncpg.Connection
) -> None:
    """Ending a lock session that may still wait for the lock names it by pid and backend_start, never by pid alone.

    A pid that now belongs to another backend (reused on this server, or after a restart) has another start.
    """
    backend = PostgresBackend(postgres_dsn, name=unique_name("pg"), **FAST)
    victim = await backend._connect("victim")
    cleanup = await backend._open("cleanup")
    try:
        assert victim.backend_start is not None
        recorded = victim.backend_start
        victim.backend_start = recorded - datetime.timedelta(microseconds=1)  # the same pid, another session
        assert not await backend._end_session(cleanup, victim)
        assert not victim.broken and await victim.raw.fetchval("SELECT 1") == 1
        victim.backend_start = recorded
        assert await backend._end_session(cleanup, victim)
        with anyio.fail_after(5):
            await victim.ended.wait()
    finally:
        victim.close()
        cleanup.close()
        await backend.aclose()


# --- connection poolers ----------------------------------------------------------------


@pytest.mark.parametrize("pool_mode", ["transaction", "statement"])
async def test_a_pooler_that_lends_server_sessions_per_transaction_is_refused(
    pgbouncer_factory: Callable[[str], PgBouncer], pool_mode: str
) -> None:
    """PgBouncer in transaction or statement mode: a session advisory lock would stay with a lent server session."""
    pooler = await anyio.to_thread.run_sync(pgbouncer_factory, pool_mode)
    async with make(pooler.dsn, unique_name("pg"), "pooled") as elector:
        started = time.monotonic()
        with anyio.fail_after(15), pytest.raises(PermanentBackendError, match="pool_mode=session"):
            await elector.acquire()
        assert time.monotonic() - started < 5, "a pooler that breaks the lock must not be retried"


async def test_a_pooler_in_session_mode_works_with_every_session_setting(
    pgbouncer_factory: Callable[[str], PgBouncer], admin: asyncpg.Connection
) -> None:
    """PgBouncer in session mode keeps one server session per client; the settings it drops are set with SET."""
    pooler = await anyio.to_thread.run_sync(pgbouncer_factory, "session")
    name = unique_name("pg")
    async with make(pooler.dsn, name, "pooled-a") as a, make(pooler.dsn, name, "pooled-b") as b:
        with anyio.fail_after(15):
            lead = await a.acquire()
        assert lead.held and lead.token is not None
        conn = lead._hold._conn  # type: ignore[attr-defined]
        assert conn.session_id == await holder_pid(admin, name), "the lock session is known by its server pid"
        shown = {k: await conn.raw.fetchval(f"SHOW {k}") for k in ("idle_session_timeout", "search_path")}
        assert shown == {"idle_session_timeout": "4s", "search_path": "pg_catalog, pg_temp"}

        async def follow() -> int | None:
            # The leadership is bound to the task that acquires it: held and released in that task.
            second = await b.acquire()
            assert second.held
            await second.release()
            return second.token

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0.5)
        assert not follower.done()
        await lead.release()
        with anyio.fail_after(10):
            token = await follower
        assert token is not None and token > lead.token


async def test_a_transaction_pool_under_load_never_lets_a_candidate_lead(
    pgbouncer_factory: Callable[[str], PgBouncer],
) -> None:
    """PgBouncer in transaction mode, its pool shared with clients running transactions all the time: however
    the pooler happens to hand out server sessions, a candidate's try_acquire() is refused every time, and two
    candidates never both lead.
    """
    pooler = await anyio.to_thread.run_sync(pgbouncer_factory, "transaction")
    tries, led, both, refused = 300, 0, 0, 0
    outcomes: dict[str, int] = {}
    async with anyio.create_task_group() as load:

        async def other_client() -> None:
            conn = await asyncpg.connect(pooler.dsn, timeout=10, statement_cache_size=0)
            try:
                while True:
                    await conn.fetchval("SELECT pg_catalog.pg_backend_pid()")
                    await asyncio.sleep(0)
            finally:
                await conn.close(timeout=5)

        for _ in range(3):
            load.start_soon(other_client)
        await asyncio.sleep(0.5)

        async def attempt(elector: PostgresElector) -> Leadership | None:
            try:
                return await elector.try_acquire()
            except ElectionError as exc:
                outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
                return None

        with anyio.fail_after(600):
            for _ in range(tries):
                name = unique_name("pool")
                async with make(pooler.dsn, name, "pooled-a") as a, make(pooler.dsn, name, "pooled-b") as b:
                    leads = [lead for lead in await asyncio.gather(attempt(a), attempt(b)) if lead is not None]
                    led += len(leads)
                    both += len(leads) == 2
                    refused += len(leads) == 0
                    for lead in leads:
                        await lead.release()
        load.cancel_scope.cancel()
    print(f"{tries} tries: {led} leaderships, {both} with both candidates leading; refusals {outcomes}")
    assert both == 0, f"both candidates led in {both} of {tries} tries"
    assert led == 0, f"a candidate led through a transaction pool in {led} of {tries} tries"


class _Statements:
    """An interceptor that counts the statements a lock session sends, and passes each on unchanged."""

    def __init__(self) -> None:
        self.count = 0

    async def exchange(self, what: str, send: Callable[[], Any]) -> Any:
        self.count += 1
        return await send()


@pytest.mark.parametrize("temp", [True, False], ids=["wait-function", "no-temp-privilege"])
async def test_a_waiter_sends_one_statement_per_poll_and_follows_the_holder(
    postgres: PostgresServer, postgres_dsn: str, temp: bool
) -> None:
    """A waiter's lock request returns the holder when it times out: one statement per poll_interval, its look
    included. A role without TEMP on the database cannot create the function that does it: the waiter falls back
    to a lock_timeout error and a look after it (two statements), and still follows the holder and takes over.
    """
    suffix = secrets.token_hex(4)
    database, role = f"aioelect_wait_{suffix}", f"aioelect_wait_{suffix}"
    postgres.query(f"CREATE DATABASE {database}")
    postgres.query(f"CREATE ROLE {role} LOGIN")
    if not temp:
        postgres.query(f"REVOKE TEMP ON DATABASE {database} FROM PUBLIC")
    dsn = with_database(postgres_dsn, database)
    try:
        name = unique_name("pg")
        async with (
            make(dsn, name, "first", user=role) as a,
            make(dsn, name, "waiter", user=role, poll_interval=0.5) as b,
        ):
            lead = await a.acquire()
            statements = _Statements()
            backend_of(b).intercept(statements)
            follower = Follower(b)
            try:
                await asyncio.sleep(1.2)  # the session is set up and waiting
                assert b.last_leader == "first"
                query = postgres.query(
                    "SELECT query FROM pg_catalog.pg_stat_activity WHERE application_name = 'waiter'", database=database
                )
                assert ("aioelect_wait" in query[0][0]) is temp, query
                before = statements.count
                await asyncio.sleep(2.0)  # four polls
                sent = statements.count - before
                assert (3 <= sent <= 5) if temp else (6 <= sent <= 10), sent
                await lead.release()
                with anyio.fail_after(10):
                    lead_b = await follower.wait()
                assert lead_b.held and lead_b.token is not None and lead.token is not None
                assert lead_b.token > lead.token
            finally:
                await follower.close()
    finally:
        postgres.query(
            f"SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity WHERE usename = '{role}'"
        )
        postgres.query(f"DROP DATABASE IF EXISTS {database}")
        postgres.query(f"DROP ROLE IF EXISTS {role}")


async def test_a_waiter_whose_wait_function_is_dropped_makes_it_again(
    postgres: PostgresServer, postgres_dsn: str
) -> None:
    """The waiter's temporary function dropped under it (a DISCARD TEMP, or an operator): its next wait makes the
    function again, and it still takes over; never a permanent error that ends its campaign."""
    name = unique_name("pg")
    async with make(postgres_dsn, name, "first") as a, make(postgres_dsn, name, "waiter", poll_interval=0.5) as b:
        lead = await a.acquire()
        follower = Follower(b)
        try:
            await asyncio.sleep(1.2)  # the waiter's session has made its function and waits through it
            dropped = postgres.query(  # the waiter's own temporary schema only: other tests share the server
                "SELECT 'pg_temp_' || b.id FROM pg_catalog.pg_stat_get_backend_idset() AS b(id) "
                "JOIN pg_catalog.pg_stat_activity a ON a.pid = pg_catalog.pg_stat_get_backend_pid(b.id) "
                "WHERE a.application_name = 'waiter' AND a.query LIKE '%aioelect_wait%'"
            )
            assert dropped, "the waiter made no wait function"
            for (schema,) in dropped:
                postgres.query(f"DROP FUNCTION {schema}.aioelect_wait(pg_catalog.int8, pg_catalog.oid, pg_catalog.oid)")
            await asyncio.sleep(1.5)  # its next waits
            await lead.release()
            with anyio.fail_after(10):
                lead_b = await follower.wait()
            assert lead_b.held and lead_b.token is not None and lead.token is not None and lead_b.token > lead.token
        finally:
            await follower.close()
