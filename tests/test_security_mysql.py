"""TLS and authentication on a real MariaDB, and secrets kept out of sight."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from urllib.parse import quote

import anyio
import pytest

from aioelect import ElectionError, MySQLElector
from aioelect.testing import Certificates, MariaDBServer

from .backends import unique_name

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
    yield server
    server.cleanup()


def dsn(server: MariaDBServer, **query: str) -> str:
    params = "&".join(f"{k}={quote(v)}" for k, v in query.items())
    return f"mysql://tls_user:{PASSWORD}@127.0.0.1:{server.port}/{server.database}" + (f"?{params}" if params else "")


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
        with anyio.fail_after(10), pytest.raises(ElectionError, match="TLS handshake failed"):
            await elector.acquire()


async def test_no_tls_is_refused_for_a_user_that_requires_it(tls_mariadb: MariaDBServer) -> None:
    async with MySQLElector(dsn(tls_mariadb), name=unique_name()) as elector:
        with anyio.fail_after(10), pytest.raises(ElectionError, match="Access denied"):
            await elector.acquire()


async def test_missing_client_certificate_is_refused(tls_mariadb: MariaDBServer, certs: Certificates) -> None:
    async with MySQLElector(dsn(tls_mariadb, **{"ssl-ca": certs.ca}), name=unique_name()) as elector:
        with anyio.fail_after(10), pytest.raises(ElectionError, match="Access denied"):
            await elector.acquire()


def test_bad_tls_options() -> None:
    with pytest.raises(ValueError, match="does not exist"):
        MySQLElector("mysql://u@127.0.0.1/db?ssl-ca=/no/such/ca.pem")
    with pytest.raises(ValueError, match="ssl-mode"):
        MySQLElector("mysql://u@127.0.0.1/db?ssl-mode=SOMETIMES")


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
