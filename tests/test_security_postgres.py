"""PostgreSQL: TLS as libpq does it, least privilege, and a fencing table nobody else can plant.

Every test runs on real throwaway servers from the harness, on loopback only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import secrets
import shutil
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from aioelect import PermanentBackendError, PostgresElector

from .backends import unique_name, with_database
from .harness import Certificates, DowngradeProxy, MissingBinaryError, PostgresServer
from .harness.plugin import server_unavailable

FAST: dict[str, Any] = {"check_interval": 0.2, "check_timeout": 1.0, "lease": 4, "poll_interval": 0.5}


@pytest.fixture(autouse=True)
def no_libpq_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No PG* TLS variable and an empty home: what libpq would read from them is what each test puts there."""
    for variable in ("PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGSSLCRL", "PGSSLNEGOTIATION"):
        monkeypatch.delenv(variable, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _tls_server(certs: Certificates, cert: str, key_file: str) -> PostgresServer:
    """A private server with ``ssl=on`` presenting ``cert`` (pg_hba still trusts plain connections too)."""
    server = PostgresServer()
    # PostgreSQL refuses a key that others can read: give the server its own copy.
    key = os.path.join(server.directory, "server-key.pem")
    shutil.copyfile(key_file, key)
    os.chmod(key, 0o600)
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(key, account.pw_uid, account.pw_gid)
    server.extra_args += ["-c", "ssl=on", "-c", f"ssl_cert_file={cert}", "-c", f"ssl_key_file={key}"]
    return server


@contextlib.contextmanager
def _running_tls_server(certs: Certificates, cert: str, key_file: str, *settings: str) -> Iterator[PostgresServer]:
    """:func:`_tls_server` with extra ``-c`` ``settings``, started, and cleaned up afterwards."""
    try:
        server = _tls_server(certs, cert, key_file)
    except MissingBinaryError as exc:
        server_unavailable(str(exc))
    for setting in settings:
        server.extra_args += ["-c", setting]
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def tls_postgres(certs: Certificates) -> Iterator[PostgresServer]:
    """TLS with a certificate for 127.0.0.1 signed by ``certs.ca``."""
    with _running_tls_server(certs, certs.server_cert, certs.server_key) as server:
        yield server


@pytest.fixture(scope="module")
def misnamed_postgres(certs: Certificates) -> Iterator[PostgresServer]:
    """TLS with a certificate signed by ``certs.ca`` that names another host (CN aioelect-client, no SAN)."""
    with _running_tls_server(certs, certs.client_cert, certs.client_key) as server:
        yield server


def base(server: PostgresServer) -> str:
    return f"postgresql://postgres@127.0.0.1:{server.port}/postgres"


def encrypted(server: PostgresServer, application_name: str) -> bool:
    rows = server.query(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
        [application_name],
    )
    assert len(rows) == 1, rows
    return bool(rows[0][0])


async def refused_at_once(elector: PostgresElector, match: str) -> str:
    """The permanent error of ``elector.acquire()``: raised without retrying."""
    started = time.monotonic()
    with anyio.fail_after(10), pytest.raises(PermanentBackendError, match=match) as info:
        await elector.acquire()
    assert time.monotonic() - started < 3, "a permanent error must not be retried"
    return str(info.value)


# --- sslmode as libpq reads it ---------------------------------------------------------


async def test_require_with_sslrootcert_verifies_the_chain(tls_postgres: PostgresServer, certs: Certificates) -> None:
    # libpq: with a root certificate, require verifies the server's chain as verify-ca does.
    async with PostgresElector(
        f"{base(tls_postgres)}?sslmode=require&sslrootcert={certs.other_ca}", name=unique_name("pg"), **FAST
    ) as elector:
        await refused_at_once(elector, "TLS handshake failed")
    async with PostgresElector(
        f"{base(tls_postgres)}?sslmode=require&sslrootcert={certs.ca}",
        name=unique_name("pg"),
        identity="req-ca",
        **FAST,
    ) as elector:
        lead = await elector.acquire()
        assert encrypted(tls_postgres, "req-ca")
        await lead.release()


async def test_require_reads_the_default_root_certificate_as_libpq_does(
    tls_postgres: PostgresServer, certs: Certificates, no_libpq_environment: Path
) -> None:
    (no_libpq_environment / ".postgresql").mkdir()
    shutil.copyfile(certs.other_ca, no_libpq_environment / ".postgresql" / "root.crt")
    async with PostgresElector(f"{base(tls_postgres)}?sslmode=require", name=unique_name("pg"), **FAST) as elector:
        await refused_at_once(elector, "TLS handshake failed")


async def test_verify_full_checks_the_host_name_and_verify_ca_does_not(
    misnamed_postgres: PostgresServer, certs: Certificates
) -> None:
    target = f"{base(misnamed_postgres)}?sslrootcert={certs.ca}&sslmode="
    async with PostgresElector(target + "verify-full", name=unique_name("pg"), **FAST) as elector:
        await refused_at_once(elector, "TLS handshake failed.*(mismatch|match)")
    async with PostgresElector(target + "verify-ca", name=unique_name("pg"), identity="ca-only", **FAST) as elector:
        lead = await elector.acquire()
        assert encrypted(misnamed_postgres, "ca-only")
        await lead.release()


@pytest.mark.parametrize("mode", ["prefer", "require", None])
async def test_without_a_root_certificate_prefer_and_require_encrypt(
    tls_postgres: PostgresServer, mode: str | None
) -> None:
    identity = f"unverified-{mode}"
    target = base(tls_postgres) + (f"?sslmode={mode}" if mode else "")
    async with PostgresElector(target, name=unique_name("pg"), identity=identity, **FAST) as elector:
        lead = await elector.acquire()
        assert encrypted(tls_postgres, identity), f"sslmode={mode} must encrypt when the server offers TLS"
        await lead.release()


async def test_prefer_with_a_wrong_root_certificate_falls_back_to_plaintext_as_libpq_does(
    tls_postgres: PostgresServer, certs: Certificates
) -> None:
    target = f"{base(tls_postgres)}?sslmode=prefer&sslrootcert={certs.other_ca}"
    async with PostgresElector(target, name=unique_name("pg"), identity="prefer-fallback", **FAST) as elector:
        lead = await elector.acquire()
        assert not encrypted(tls_postgres, "prefer-fallback")
        await lead.release()
    target = f"{base(tls_postgres)}?sslmode=prefer&sslrootcert={certs.ca}"
    async with PostgresElector(target, name=unique_name("pg"), identity="prefer-verified", **FAST) as elector:
        lead = await elector.acquire()
        assert encrypted(tls_postgres, "prefer-verified")
        await lead.release()


async def test_allow_and_disable_stay_plaintext_on_a_tls_server(tls_postgres: PostgresServer) -> None:
    for mode in ("allow", "disable"):
        async with PostgresElector(
            f"{base(tls_postgres)}?sslmode={mode}", name=unique_name("pg"), identity=mode, **FAST
        ) as elector:
            lead = await elector.acquire()
            assert not encrypted(tls_postgres, mode)
            await lead.release()


async def test_a_handshake_the_server_refuses_is_permanent(certs: Certificates) -> None:
    """A server that answers the handshake with an alert (here: no common TLS version) is refused at once.

    Like a refused certificate it is configuration, and no retry can fix it.
    """
    with _running_tls_server(certs, certs.server_cert, certs.server_key, "ssl_min_protocol_version=TLSv1.3") as server:
        context = ssl.create_default_context(cafile=certs.ca)
        context.maximum_version = ssl.TLSVersion.TLSv1_2
        async with PostgresElector(base(server), name=unique_name("pg"), ssl=context, **FAST) as elector:
            message = await refused_at_once(elector, "TLS handshake failed")
        assert "alert" in message.lower() or "version" in message.lower(), message


@pytest.fixture(scope="module")
def tls_only_postgres(certs: Certificates) -> Iterator[PostgresServer]:
    """TLS as ``tls_postgres``, and pg_hba refuses plaintext connections."""
    with _running_tls_server(certs, certs.server_cert, certs.server_key) as server:
        hba = Path(server.data_dir) / "pg_hba.conf"
        hba.write_text("hostnossl all all 127.0.0.1/32 reject\n" + hba.read_text())
        server.query("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 10  # the reload is asynchronous
        while not server.query("SELECT count(*) FROM pg_hba_file_rules WHERE type = 'hostnossl'")[0][0]:
            assert time.monotonic() < deadline, "pg_hba.conf was not reloaded"
            time.sleep(0.05)
        yield server


async def test_allow_turns_to_tls_when_the_server_refuses_plaintext(tls_only_postgres: PostgresServer) -> None:
    async with PostgresElector(
        f"{base(tls_only_postgres)}?sslmode=allow", name=unique_name("pg"), identity="allow-tls", **FAST
    ) as elector:
        lead = await elector.acquire()
        assert encrypted(tls_only_postgres, "allow-tls")
        await lead.release()
    async with PostgresElector(f"{base(tls_only_postgres)}?sslmode=disable", name=unique_name("pg"), **FAST) as e:
        await refused_at_once(e, "28000")


async def test_require_on_a_server_without_tls_is_permanent(postgres: PostgresServer) -> None:
    async with PostgresElector(f"{base(postgres)}?sslmode=require", name=unique_name("pg"), **FAST) as elector:
        await refused_at_once(elector, "does not support TLS")
    async with PostgresElector(
        f"{base(postgres)}?sslmode=prefer", name=unique_name("pg"), identity="plain-prefer", **FAST
    ) as elector:
        lead = await elector.acquire()  # prefer: plaintext when the server has no TLS
        assert not encrypted(postgres, "plain-prefer")
        await lead.release()


@pytest.mark.parametrize("mode", ["require", "verify-ca", "verify-full"])
async def test_a_proxy_that_refuses_tls_for_the_server_is_refused(
    tls_postgres: PostgresServer, certs: Certificates, mode: str
) -> None:
    """A man in the middle answers 'N' to the SSLRequest of a TLS server: never a plaintext session."""
    with DowngradeProxy(("127.0.0.1", tls_postgres.port), "postgres") as proxy:
        target = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres?sslmode={mode}&sslrootcert={certs.ca}"
        async with PostgresElector(target, name=unique_name("pg"), **FAST) as elector:
            await refused_at_once(elector, "does not support TLS")
        assert proxy.downgraded >= 1


async def test_the_password_is_read_from_pgpassword_and_pgpassfile_as_libpq_does(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Documented: with no password given, PGPASSWORD, else the password file, else none (refused at once)."""
    role, password = f"pw_{secrets.token_hex(4)}", f"Pw-{secrets.token_hex(6)}"
    postgres.query(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    hba = Path(postgres.data_dir) / "pg_hba.conf"
    original = hba.read_text()
    hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + original)
    try:
        postgres.query("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 10  # the reload is asynchronous
        while not postgres.query("SELECT count(*) FROM pg_hba_file_rules WHERE $1 = ANY(user_name)", [role])[0][0]:
            assert time.monotonic() < deadline, "pg_hba.conf was not reloaded"
            await anyio.sleep(0.05)
        dsn = f"postgresql://{role}@127.0.0.1:{postgres.port}/postgres?sslmode=disable"
        for variable in ("PGPASSWORD", "PGPASSFILE", "PGSERVICE", "PGSERVICEFILE"):
            monkeypatch.delenv(variable, raising=False)
        async with PostgresElector(dsn, name=unique_name("pg"), **FAST) as elector:
            await refused_at_once(elector, "28P01|password")
        monkeypatch.setenv("PGPASSWORD", password)
        async with PostgresElector(dsn, name=unique_name("pg"), **FAST) as elector:
            with anyio.fail_after(10):
                await (await elector.acquire()).release()
        monkeypatch.delenv("PGPASSWORD")
        passfile = tmp_path / "pgpass"
        passfile.write_text(f"127.0.0.1:{postgres.port}:*:{role}:{password}\n")
        passfile.chmod(0o600)
        monkeypatch.setenv("PGPASSFILE", str(passfile))
        async with PostgresElector(dsn, name=unique_name("pg"), **FAST) as elector:
            with anyio.fail_after(10):
                await (await elector.acquire()).release()
    finally:
        hba.write_text(original)
        postgres.query("SELECT pg_reload_conf()")
        postgres.query(f"DROP ROLE IF EXISTS {role}")


async def test_pgsslmode_is_read_as_libpq_reads_it(postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGSSLMODE", "require")
    async with PostgresElector(base(postgres), name=unique_name("pg"), **FAST) as elector:
        await refused_at_once(elector, "does not support TLS")
    # The DSN's sslmode wins over the environment.
    async with PostgresElector(f"{base(postgres)}?sslmode=disable", name=unique_name("pg"), **FAST) as elector:
        lead = await elector.acquire()
        await lead.release()


def test_verification_needs_a_root_certificate(certs: Certificates) -> None:
    for mode in ("verify-ca", "verify-full"):
        with pytest.raises(ValueError, match="root certificate"):
            PostgresElector(f"postgresql://u@127.0.0.1/db?sslmode={mode}", name="x")
    with pytest.raises(ValueError, match="sslrootcert=system"):
        PostgresElector("postgresql://u@127.0.0.1/db?sslmode=require&sslrootcert=system", name="x")
    PostgresElector("postgresql://u@127.0.0.1/db?sslmode=verify-full&sslrootcert=system", name="x")
    with pytest.raises(ValueError, match="does not exist"):
        PostgresElector("postgresql://u@127.0.0.1/db?sslmode=require&sslrootcert=/no/such/ca.pem", name="x")


# --- one WARNING for a network connection that is not encrypted and verified ----------------


def test_one_warning_for_an_unverified_connection_to_another_host(
    caplog: pytest.LogCaptureFixture, certs: Certificates
) -> None:
    # Only constructs electors: nothing is sent to these (non-loopback) addresses.
    caplog.set_level(logging.WARNING, logger="aioelect")
    cases: list[tuple[str, str | None]] = [
        ("postgresql://u:pw-Secret@db.example.com/app", "not verified"),
        ("postgresql://u@10.1.2.3/app?sslmode=prefer", "not verified"),
        ("postgresql://u@10.1.2.3/app?sslmode=require", "not verified"),
        ("postgresql://u@10.1.2.3/app?sslmode=allow", "not encrypted"),
        ("postgresql://u@db.example.com/app?sslmode=disable", "not encrypted"),
        (f"postgresql://u@db.example.com/app?sslmode=prefer&sslrootcert={certs.ca}", "falls back to plaintext"),
        (f"postgresql://u@db.example.com/app?sslmode=require&sslrootcert={certs.ca}", None),
        (f"postgresql://u@db.example.com/app?sslmode=verify-full&sslrootcert={certs.ca}", None),
        ("postgresql://u@127.0.0.1/app?sslmode=disable", None),
        ("postgresql://u@localhost/app", None),
        ("postgresql://u@[::1]/app?sslmode=prefer", None),
    ]
    for dsn, warning in cases:
        caplog.clear()
        PostgresElector(dsn, name="x")
        records = [r for r in caplog.records if r.levelno == logging.WARNING]
        if warning is None:
            assert not records, (dsn, [r.getMessage() for r in records])
        else:
            assert len(records) == 1, (dsn, [r.getMessage() for r in records])
            assert warning in records[0].getMessage() and "pw-Secret" not in records[0].getMessage()


# --- least privilege --------------------------------------------------------------------


@pytest.fixture
def roles(postgres: PostgresServer) -> Iterator[list[str]]:
    """Roles a test makes, dropped afterwards (after the database that refers to them)."""
    made: list[str] = []
    yield made
    for role in made:
        postgres.query(f"DROP ROLE IF EXISTS {role}")


@pytest.fixture
async def database(postgres: PostgresServer, roles: list[str]) -> AsyncIterator[str]:
    """A new database on the session server, dropped afterwards."""
    name = f"aioelect_sec_{secrets.token_hex(4)}"
    postgres.query(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        postgres.query(f"DROP DATABASE {name} WITH (FORCE)")


def make_role(postgres: PostgresServer, database: str, role: str) -> None:
    """A login role with the default privileges only (CONNECT and TEMP through PUBLIC)."""
    postgres.query(f"CREATE ROLE {role} LOGIN")
    postgres.query(f"GRANT CONNECT ON DATABASE {database} TO {role}")


async def test_a_role_with_only_connect_elects_with_fencing_tokens(
    postgres: PostgresServer, database: str, roles: list[str]
) -> None:
    role = f"bare_{secrets.token_hex(3)}"
    make_role(postgres, database, role)
    roles.append(role)
    assert not postgres.query("SELECT has_schema_privilege($1, 'public', 'CREATE')", [role], database=database)[0][0]
    dsn = f"postgresql://{role}@127.0.0.1:{postgres.port}/{database}"
    name = unique_name("pg")
    tokens: list[int] = []
    async with (
        PostgresElector(dsn, name=name, identity="a", fencing=True, **FAST) as a,
        PostgresElector(dsn, name=name, identity="b", fencing=True, **FAST) as b,
    ):
        for elector in (a, b, a, b):
            with anyio.fail_after(10):
                lead = await elector.acquire()
            assert lead.token is not None
            tokens.append(lead.token)
            assert await a.leader() == elector.identity
            await lead.release()
    assert tokens == sorted(set(tokens)), f"tokens must grow strictly across leaders: {tokens}"
    # Nothing was created, nothing needed creating.
    assert not postgres.query("SELECT to_regclass('public.aioelect_leaders')", database=database)[0][0]


async def test_a_table_that_needs_a_privilege_names_it_and_the_option_that_avoids_it(
    postgres: PostgresServer, database: str, roles: list[str]
) -> None:
    role = f"bare_{secrets.token_hex(3)}"
    make_role(postgres, database, role)
    roles.append(role)
    dsn = f"postgresql://{role}@127.0.0.1:{postgres.port}/{database}"
    async with PostgresElector(dsn, name=unique_name("pg"), fencing=True, schema="public", **FAST) as elector:
        message = await refused_at_once(elector, "CREATE on schema public")
        assert "schema=None" in message
    async with PostgresElector(dsn, name=unique_name("pg"), schema="nowhere", **FAST) as elector:
        await refused_at_once(elector, 'schema "nowhere" does not exist')


async def test_the_leaders_table_in_an_own_schema_records_full_identities(
    postgres: PostgresServer, database: str, roles: list[str]
) -> None:
    role = f"owner_{secrets.token_hex(3)}"
    make_role(postgres, database, role)
    roles.append(role)
    postgres.query(f"CREATE SCHEMA elect AUTHORIZATION {role}", database=database)
    dsn = f"postgresql://{role}@127.0.0.1:{postgres.port}/{database}"
    identity = "host.example:4711:" + "x" * 80
    name = unique_name("pg")
    async with (
        PostgresElector(dsn, name=name, identity=identity, fencing=True, schema="elect", **FAST) as a,
        PostgresElector(dsn, name=name, schema="elect", **FAST) as observer,
    ):
        lead = await a.acquire()
        assert await observer.leader() == identity  # more than application_name's 63 bytes
        rows = postgres.query(
            "SELECT token, holder, pg_get_userbyid(c.relowner) FROM elect.aioelect_leaders, pg_class c "
            "WHERE c.oid = 'elect.aioelect_leaders'::regclass AND name = $1",
            [name],
            database=database,
        )
        assert rows == [(lead.token, identity, role)]
        await lead.release()


# --- a table planted by someone else (CVE-2018-1058 class) ----------------------------------


async def test_a_planted_table_is_refused_and_its_trigger_never_runs(
    postgres: PostgresServer, database: str, roles: list[str]
) -> None:
    intruder = f"intruder_{secrets.token_hex(3)}"
    make_role(postgres, database, intruder)
    roles.append(intruder)
    # PostgreSQL 14's defaults: every role may create in schema public.
    postgres.query("GRANT CREATE ON SCHEMA public TO PUBLIC", database=database)
    plant = f"""
    SET ROLE {intruder};
    CREATE TABLE public.intruder_log (who text, at timestamptz DEFAULT now());
    GRANT INSERT ON public.intruder_log TO PUBLIC;
    CREATE TABLE public.aioelect_leaders (
      name text PRIMARY KEY, token bigint NOT NULL, holder text NOT NULL, pid integer NOT NULL,
      acquired_at timestamptz NOT NULL DEFAULT now());
    GRANT ALL ON public.aioelect_leaders TO PUBLIC;
    CREATE FUNCTION public.intrude() RETURNS trigger LANGUAGE plpgsql AS
      $$ BEGIN INSERT INTO public.intruder_log (who) VALUES (current_user); RETURN NEW; END $$;
    CREATE TRIGGER intrude BEFORE INSERT OR UPDATE ON public.aioelect_leaders
      FOR EACH ROW EXECUTE FUNCTION public.intrude();
    """
    conn = await asyncpg.connect(with_database(postgres.dsn, database), timeout=10)
    try:
        await conn.execute(plant)
    finally:
        await conn.close(timeout=5)

    def intrusions() -> list[tuple[Any, ...]]:
        return postgres.query("SELECT who FROM public.intruder_log", database=database)

    # The victim is the superuser with default options and fencing on, as the command line runs it.
    victim = with_database(postgres.dsn, database)
    async with PostgresElector(victim, name=unique_name("pg"), fencing=True, **FAST) as elector:
        lead = await elector.acquire()
        assert lead.token is not None
        await lead.release()
    assert intrusions() == [], "the intruder's trigger ran as aioelect's role"
    # Asked to keep the table in that schema: refused, naming the owner.
    for options in ({"fencing": True}, {}):
        async with PostgresElector(victim, name=unique_name("pg"), schema="public", **options, **FAST) as elector:
            message = await refused_at_once(elector, f"owned by {intruder}")
            assert "public.aioelect_leaders" in message
            with pytest.raises(PermanentBackendError, match=f"owned by {intruder}"):
                await elector.leader()
    assert intrusions() == [], "the intruder's trigger ran as aioelect's role"


async def test_a_schema_owned_by_another_role_is_refused(
    postgres: PostgresServer, database: str, roles: list[str]
) -> None:
    other = f"other_{secrets.token_hex(3)}"
    make_role(postgres, database, other)
    roles.append(other)
    postgres.query(f"CREATE SCHEMA theirs AUTHORIZATION {other}", database=database)
    postgres.query("GRANT CREATE, USAGE ON SCHEMA theirs TO PUBLIC", database=database)
    victim = with_database(postgres.dsn, database)
    # Its owner could swap our table for theirs at any time: refused before anything is created.
    async with PostgresElector(victim, name=unique_name("pg"), schema="theirs", **FAST) as elector:
        await refused_at_once(elector, f"schema theirs is owned by {other}")
    assert not postgres.query("SELECT to_regclass('theirs.aioelect_leaders')", database=database)[0][0]


def test_schema_option_is_checked() -> None:
    for bad in ("", "x" * 64, "a\x00b", 3):
        with pytest.raises(ValueError, match="schema"):
            PostgresElector("postgresql://u@127.0.0.1/db", name="x", schema=bad)  # type: ignore[arg-type]


# --- fencing tokens survive a server crash ------------------------------------------------


async def test_tokens_grow_across_a_server_crash(fresh_postgres: PostgresServer) -> None:
    # A token is durable before it is handed out: a crash right after cannot make the
    # server hand the same transaction id (the next leader's token) out again.
    name = unique_name("pg")
    last = 0
    for _ in range(3):
        async with PostgresElector(fresh_postgres.dsn, name=name, fencing=True, **FAST) as elector:
            with anyio.fail_after(20):
                lead = await elector.acquire()
            assert lead.token is not None and lead.token > last, (last, lead.token)
            last = lead.token
            await anyio.to_thread.run_sync(fresh_postgres.kill)
        await anyio.to_thread.run_sync(fresh_postgres.start)


@pytest.mark.parametrize("attempt", range(4))
async def test_red1_a_terminated_leader_over_tls_is_lost_before_a_waiting_candidate_leads(
    tls_postgres: PostgresServer, attempt: int
) -> None:
    """Red team: the FATAL watch (EndWatch) sits on asyncpg's transport; over TLS that is the SSL transport, and the
    FATAL arrives as TLS records. A terminated leader over TLS must still be lost before a waiting candidate leads."""
    import asyncio

    from aioelect import LossKind

    from .test_postgres import holder_pid

    slow = {"check_interval": 5.0, "check_timeout": 4.0, "lease": 20, "poll_interval": 0.3}
    name = unique_name("pg")
    seen: list[bool] = []
    admin = await asyncpg.connect(base(tls_postgres))
    try:
        async with (
            PostgresElector(f"{base(tls_postgres)}?sslmode=require", name=name, identity="A", **slow) as a,
            PostgresElector(base(tls_postgres), name=name, identity="B", **slow) as b,
        ):
            la = await a.acquire()

            async def follow() -> None:
                lb = await b.acquire()
                seen.append(la.held)
                await lb.release()

            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                await asyncio.sleep(0.5)
                pid = await holder_pid(admin, name)
                assert await admin.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = $1", pid)
                assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
                with anyio.fail_after(10):
                    while not seen:
                        await asyncio.sleep(0.01)
            assert seen == [False], "A (over TLS) still led when B took the lock: two leaders"
            assert la.lost_kind is LossKind.CONNECTION_LOST
            await la.release()
    finally:
        await admin.close()
