"""TLS and authentication on a real MariaDB, and secrets kept out of sight."""

from __future__ import annotations

import logging
import secrets
import ssl
from collections.abc import Iterator
from urllib.parse import quote

import anyio
import pytest

from aioelect import ElectionError, MySQLElector, PermanentBackendError
from aioelect.backends.sql._mysql_tls import tls_from_query

from .backends import unique_name
from .harness import Certificates, DowngradeProxy, MariaDBServer

PASSWORD = "tls-Secret-4711"


@pytest.fixture(scope="module")
def tls_mariadb(certs: Certificates) -> Iterator[MariaDBServer]:
    server = MariaDBServer(
        extra_args=[f"--ssl-cert={certs.server_cert}", f"--ssl-key={certs.server_key}", f"--ssl-ca={certs.ca}"]
    )
    try:
        server.start()
    except Exception:
        server.cleanup()
        raise
    server.create_user("tls_user", PASSWORD)
    server.query("ALTER USER 'tls_user'@'%' REQUIRE X509", database="")
    server.create_user("ssl_user", PASSWORD)
    server.query("ALTER USER 'ssl_user'@'%' REQUIRE SSL", database="")
    yield server
    server.cleanup()


def dsn(server: MariaDBServer, user: str = "tls_user", **query: str) -> str:
    params = "&".join(f"{k}={quote(v)}" for k, v in query.items())
    return f"mysql://{user}:{PASSWORD}@127.0.0.1:{server.port}/{server.database}" + (f"?{params}" if params else "")


async def test_right_ca_and_client_certificate_elect(tls_mariadb: MariaDBServer, certs: Certificates) -> None:
    target = dsn(tls_mariadb, **{"ssl-ca": certs.ca, "ssl-cert": certs.client_cert, "ssl-key": certs.client_key})
    async with MySQLElector(target, name=unique_name(), fencing=True, identity="tls-leader") as elector:
        lead = await elector.acquire()
        # tls_user REQUIRE X509: the server let us in only over TLS with our client certificate.
        assert lead.held and await elector.leader() == "tls-leader"
        await lead.release()


async def test_wrong_ca_is_refused_clearly(tls_mariadb: MariaDBServer, certs: Certificates) -> None:
    target = dsn(tls_mariadb, **{"ssl-ca": certs.other_ca, "ssl-cert": certs.client_cert, "ssl-key": certs.client_key})
    async with MySQLElector(target, name=unique_name()) as elector:
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="TLS handshake failed"):
            await elector.acquire()


async def test_no_tls_is_refused_for_a_user_that_requires_it(tls_mariadb: MariaDBServer) -> None:
    async with MySQLElector(dsn(tls_mariadb), name=unique_name()) as elector:
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="Access denied"):
            await elector.acquire()


async def test_missing_client_certificate_is_refused(tls_mariadb: MariaDBServer, certs: Certificates) -> None:
    async with MySQLElector(dsn(tls_mariadb, **{"ssl-ca": certs.ca}), name=unique_name()) as elector:
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="Access denied"):
            await elector.acquire()


@pytest.mark.parametrize("spelling", ["ssl_", "ssl-"])
async def test_both_tls_key_spellings_really_use_tls(
    tls_mariadb: MariaDBServer, certs: Certificates, spelling: str
) -> None:
    """``ssl_mode``/``ssl_ca`` (PyMySQL's, SQLAlchemy's spelling) and ``ssl-mode``/``ssl-ca`` both mean TLS."""
    target = dsn(tls_mariadb, "ssl_user", **{f"{spelling}mode": "VERIFY_IDENTITY", f"{spelling}ca": certs.ca})
    elector = MySQLElector(target, name=unique_name(), fencing=True, identity="tls-leader")
    async with elector:
        with anyio.fail_after(10):
            lead = await elector.acquire()
        # ssl_user REQUIRE SSL: the server let us in only over TLS; and the elector's own connection says so.
        assert lead.held and await elector.leader() == "tls-leader"
        conn = await elector._backend._connect()  # type: ignore[attr-defined]
        try:
            cipher = await conn.scalar(
                "SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = 'Ssl_cipher'",
                timeout=5,
            )
        finally:
            conn.close()
        assert cipher, "the elector's connection is not encrypted"
        await lead.release()


async def test_verify_identity_in_underscore_spelling_refuses_an_untrusted_server(
    tls_mariadb: MariaDBServer, certs: Certificates
) -> None:
    target = dsn(tls_mariadb, "ssl_user", ssl_mode="VERIFY_IDENTITY", ssl_ca=certs.other_ca)
    async with MySQLElector(target, name=unique_name()) as elector:
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="TLS handshake failed"):
            await elector.acquire()


async def test_required_encrypts_without_verifying(tls_mariadb: MariaDBServer, certs: Certificates) -> None:
    """REQUIRED is what MySQL says: TLS, but any certificate is accepted (hence its WARNING off loopback)."""
    target = dsn(tls_mariadb, "ssl_user", ssl_mode="REQUIRED", ssl_ca=certs.other_ca)
    async with MySQLElector(target, name=unique_name()) as elector:
        with anyio.fail_after(10):
            lead = await elector.acquire()
        assert lead.held  # ssl_user REQUIRE SSL: encrypted, though the CA does not match
        await lead.release()


async def test_tls_user_is_refused_without_the_tls_keys(tls_mariadb: MariaDBServer) -> None:
    async with MySQLElector(dsn(tls_mariadb, "ssl_user"), name=unique_name()) as elector:
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="Access denied"):
            await elector.acquire()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sslmode=require", r"unsupported DSN parameter.*'sslmode'.*ssl_mode"),
        ("ssl_mod=VERIFY_IDENTITY", r"'ssl_mod'.*ssl-ca"),
        ("charset=utf8", r"'charset'"),
        ("ssl_mode=VERIFY_IDENTITY&ssl-mode=DISABLED", r"both spellings \(ssl_mode and ssl-mode\)"),
        ("ssl_ca=/a.pem&ssl-ca=/b.pem", r"both spellings \(ssl_ca and ssl-ca\)"),
        ("ssl_mode=PREFERRED", "PREFERRED"),
        ("ssl_mode=DISABLED&ssl_ca=/etc/hostname", "DISABLED"),
        ("ssl_mode=SOMETIMES", "VERIFY_IDENTITY"),
    ],
)
def test_unknown_or_contradictory_dsn_keys_are_refused_by_name(query: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MySQLElector(f"mysql://u:pw@127.0.0.1/db?{query}", name="t")


def test_ssl_mode_values_are_case_insensitive(certs: Certificates) -> None:
    verified = tls_from_query({"ssl_mode": "verify_identity", "ssl_ca": certs.ca})
    assert verified is not None
    assert verified.check_hostname and verified.verify_mode == ssl.CERT_REQUIRED
    required = tls_from_query({"ssl-mode": "required"})
    assert required is not None and required.verify_mode == ssl.CERT_NONE
    assert tls_from_query({"ssl-mode": "disabled"}) is None
    MySQLElector(f"mysql://u@127.0.0.1/db?ssl_mode=verify_identity&ssl_ca={quote(certs.ca)}", name="t")


# --- one WARNING for a connection that can be read or impersonated on the network -----------


def transport_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "connection to" in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", "not encrypted"),
        ("?ssl_mode=DISABLED", "not encrypted"),
        ("?ssl_mode=REQUIRED", "not verified"),
        ("?ssl_mode=VERIFY_CA&ssl_ca={ca}", None),
        ("?ssl_mode=VERIFY_IDENTITY&ssl_ca={ca}", None),
        ("?ssl_ca={ca}", None),  # a CA alone means VERIFY_IDENTITY
    ],
)
@pytest.mark.parametrize("host", ["db.example.com", "10.1.2.3", "127.0.0.1", "localhost", "[::1]"])
def test_one_warning_per_elector_for_an_exposed_connection(
    caplog: pytest.LogCaptureFixture, certs: Certificates, query: str, expected: str | None, host: str
) -> None:
    """Decided when the elector is built: no traffic goes to the non-loopback hosts."""
    caplog.set_level(logging.WARNING, logger="aioelect")
    MySQLElector(f"mysql://u:{PASSWORD}@{host}:3306/db" + query.format(ca=quote(certs.ca)), name=unique_name())
    seen = transport_warnings(caplog)
    if expected is None or host in ("127.0.0.1", "localhost", "[::1]"):
        assert seen == []
    else:
        assert len(seen) == 1 and expected in seen[0] and host in seen[0], seen
    assert PASSWORD not in caplog.text


def test_ssl_context_argument_is_judged_too(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aioelect")
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    # A database for the fencing tokens' table, which are on by default.
    MySQLElector(host="db.example.com", database="app", ssl=unverified, name=unique_name())
    MySQLElector(host="db.example.com", database="app", ssl=ssl.create_default_context(), name=unique_name())
    seen = transport_warnings(caplog)
    assert len(seen) == 1 and "not verified" in seen[0], seen


def test_bad_tls_options() -> None:
    with pytest.raises(ValueError, match="does not exist"):
        MySQLElector("mysql://u@127.0.0.1/db?ssl-ca=/no/such/ca.pem", name="t")
    with pytest.raises(ValueError, match="ssl-mode"):
        MySQLElector("mysql://u@127.0.0.1/db?ssl-mode=SOMETIMES", name="t")


async def test_password_never_appears_in_logs_reprs_or_errors(
    tls_mariadb: MariaDBServer, certs: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aioelect")
    seen: list[str] = []
    good = dsn(tls_mariadb, **{"ssl-ca": certs.ca, "ssl-cert": certs.client_cert, "ssl-key": certs.client_key})
    bad_password = good.replace(PASSWORD, PASSWORD + "-wrong")
    for target in (good, bad_password, dsn(tls_mariadb)):
        async with MySQLElector(target, name=unique_name(), fencing=True) as elector:
            seen.append(repr(elector))
            try:
                with anyio.fail_after(10):
                    lead = await elector.acquire()
                seen.append(repr(lead))
                seen.append(str(await elector.leader()))
                await lead.release()
            except ElectionError as exc:
                seen.append(str(exc))
                seen.append(repr(exc))
    seen.append(caplog.text)
    seen.extend(repr(r.__dict__) for r in caplog.records)
    text = "\n".join(seen)
    assert "Access denied" in text  # the failures were captured...
    assert PASSWORD not in text  # ...and the password never was


# --- passwords with URL delimiters --------------------------------------------------------

ODD_PASSWORD = "12#34/5?6@7:8%9 x"


async def test_percent_encoded_password_with_url_delimiters_connects(mariadb: MariaDBServer) -> None:
    target = mariadb.create_user("odd_user", ODD_PASSWORD)  # the harness percent-encodes it
    async with MySQLElector(target, name=unique_name(), fencing=True, identity="odd-leader") as elector:
        with anyio.fail_after(10):
            lead = await elector.acquire()
        assert lead.held and await elector.leader() == "odd-leader"
        await lead.release()


@pytest.mark.parametrize("raw", ["1234#5", "ab/cd", "ab?cd", "ab@cd"])
def test_unencoded_delimiter_in_password_is_refused_without_showing_it(mariadb: MariaDBServer, raw: str) -> None:
    target = f"mysql://root:{raw}@127.0.0.1:{mariadb.port}/{mariadb.database}"
    with pytest.raises(ValueError, match="percent-encode") as info:
        MySQLElector(target, name=unique_name())
    chained: BaseException | None = info.value
    while chained is not None:
        for part in (raw[i : i + 3] for i in range(len(raw) - 2)):
            assert part not in str(chained) and part not in repr(chained)
        chained = chained.__cause__ or chained.__context__


TLS_QUERIES = [
    {"ssl_mode": "REQUIRED"},
    {"ssl-mode": "REQUIRED"},
    {"ssl_ca": "CA"},
    {"ssl_mode": "VERIFY_CA", "ssl_ca": "CA"},
]


def _tls_query(query: dict[str, str], certs: Certificates) -> str:
    return "&".join(f"{k}={quote(certs.ca if v == 'CA' else v)}" for k, v in query.items())


@pytest.mark.parametrize("query", TLS_QUERIES, ids=lambda q: "&".join(f"{k}={v}" for k, v in q.items()))
async def test_a_dsn_that_asks_for_tls_never_connects_in_plaintext(
    mariadb: MariaDBServer, tls_mariadb: MariaDBServer, certs: Certificates, query: dict[str, str]
) -> None:
    """Against a server without TLS, and through a proxy that clears CLIENT_SSL in the greeting: refused at once.

    The refusal comes before the client answers the greeting, so no
    credential leaves the client in plaintext.
    """
    params = _tls_query(query, certs)
    with DowngradeProxy(("127.0.0.1", tls_mariadb.port), "mysql") as proxy:
        for port in (mariadb.port, proxy.port):
            target = f"mysql://root@127.0.0.1:{port}/{mariadb.database}?{params}"
            async with MySQLElector(target, name=unique_name()) as elector:
                with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="does not offer TLS") as raised:
                    await elector.acquire()
            assert "plaintext" in str(raised.value)
        assert proxy.downgraded >= 1
    # Through the proxy without TLS options, the same server is reachable: the refusal is the TLS check's.
    with DowngradeProxy(("127.0.0.1", tls_mariadb.port), "mysql") as proxy:
        async with MySQLElector(f"mysql://root@127.0.0.1:{proxy.port}/{tls_mariadb.database}", name=unique_name()) as e:
            with anyio.fail_after(10):
                lead = await e.acquire()
            await lead.release()


async def test_the_transport_is_checked_after_the_connect_too(
    mariadb: MariaDBServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should the driver ever skip the greeting check, the connection is still refused for its plaintext transport."""
    import aiomysql

    from aioelect.backends.sql import mysql

    unchecked = aiomysql.Connection._request_authentication
    monkeypatch.setattr(mysql._TlsOnlyConnection, "_request_authentication", unchecked)
    target = f"mysql://root@127.0.0.1:{mariadb.port}/{mariadb.database}?ssl_mode=REQUIRED"
    async with MySQLElector(target, name=unique_name()) as elector:
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="does not offer TLS"):
            await elector.acquire()


async def test_mysql_pwd_is_never_read(mariadb: MariaDBServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Documented: the MySQL client's variables are ignored; the password comes from the DSN or password= only."""
    user, password = f"pwd_{secrets.token_hex(3)}", f"Pwd-{secrets.token_hex(6)}"
    mariadb.create_user(user, password)
    monkeypatch.setenv("MYSQL_PWD", password)
    target = f"mysql://{user}@127.0.0.1:{mariadb.port}/{mariadb.database}"
    async with MySQLElector(target, name=unique_name()) as elector:
        with anyio.fail_after(10), pytest.raises(PermanentBackendError, match="Access denied"):
            await elector.acquire()
    async with MySQLElector(target, name=unique_name(), password=password) as elector:
        with anyio.fail_after(10):
            await (await elector.acquire()).release()


@pytest.mark.parametrize("attempt", range(3))
async def test_a_killed_shared_session_over_tls_loses_every_leadership_before_another_leads(
    tls_mariadb: MariaDBServer, certs: Certificates, attempt: int
) -> None:
    """the shared session's end hooks sit on aiomysql's transport protocol; over TLS that is the app
    protocol of an SSL transport. A KILLed shared session over TLS must still be lost before B takes the lock."""
    import asyncio

    from aioelect import LossKind, MySQLSession

    slow = {"lease": 10, "check_interval": 3.0, "check_timeout": 0.5, "renew_deadline": 6.0, "poll_interval": 0.3}
    target = dsn(tls_mariadb, **{"ssl-ca": certs.ca, "ssl-cert": certs.client_cert, "ssl-key": certs.client_key})
    plain = dsn(tls_mariadb, user="ssl_user", **{"ssl-ca": certs.ca})
    name = unique_name()
    seen: list[bool] = []
    async with (
        MySQLSession(target, identity="A", **slow) as session,  # type: ignore[arg-type]
        MySQLElector(plain, name=name, identity="B", **slow) as b,  # type: ignore[arg-type]
    ):
        a = MySQLElector(session=session, name=name)
        async with a:
            la = await a.acquire()

            async def follow() -> None:
                _lead = await b.acquire()  # held by this task until it is cancelled
                seen.append(la.held)
                await asyncio.sleep(3600)

            task = asyncio.create_task(follow())
            try:
                await asyncio.sleep(0.5)
                conn = session._conn
                assert conn is not None
                tls_mariadb.query("KILL %s", (conn.session_id,), database="")
                with anyio.fail_after(20):
                    while not seen:
                        await asyncio.sleep(0.01)
                assert seen == [False], "A (shared session over TLS) still led when B took the lock"
                assert la.lost_kind is LossKind.CONNECTION_LOST
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
