"""etcd over TLS (CA, client certificate, password) on a real etcd, and secrets kept out of sight.

One etcd serves the module: TLS client listener with ``--client-cert-auth``,
authentication enabled for ``root``, and simple auth tokens that expire
after one idle second (``--auth-token-ttl=1``), so that every test also
runs through token renewal (etcd issue 17623).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from aioelect import BackendUnavailable, ElectionError, EtcdElector
from aioelect.backends.etcd import EtcdBackend, parse_endpoints
from aioelect.backends.etcd._connection import Connection

from .backends import Follower, unique_name
from .harness import Certificates, EtcdServer, MissingBinaryError, TCPProxy, free_port, require_binary
from .harness.plugin import server_unavailable

pytestmark = pytest.mark.timeout(60)

PASSWORD = "etcd-Tls-Secret-9127"
#: Idle seconds after which etcd forgets an auth token.
TOKEN_TTL = 1
#: A refused TLS setup must be reported well within this (connect_timeout is 5 s by default).
REFUSAL_BOUND = 8.0


def tls_args(certs: Certificates) -> list[str]:
    return [f"--cacert={certs.ca}", f"--cert={certs.client_cert}", f"--key={certs.client_key}"]


def start_tls_etcd(certs: Certificates, *extra: str) -> EtcdServer:
    """A started etcd: TLS client listener, --client-cert-auth, user root with PASSWORD, auth enabled."""
    try:
        server = EtcdServer(
            client_scheme="https",
            extra_args=[
                f"--cert-file={certs.server_cert}",
                f"--key-file={certs.server_key}",
                f"--trusted-ca-file={certs.ca}",
                "--client-cert-auth",
                *extra,
            ],
        )
    except MissingBinaryError as exc:
        server_unavailable(str(exc))
    try:
        server.start()
        for args in (("user", "add", f"root:{PASSWORD}"), ("auth", "enable")):
            server.etcdctl(*tls_args(certs), *args, check=True)
    except BaseException:
        server.cleanup()
        raise
    return server


@pytest.fixture(scope="module")
def tls_etcd(certs: Certificates) -> Iterator[EtcdServer]:
    server = start_tls_etcd(certs, f"--auth-token-ttl={TOKEN_TTL}")
    yield server
    server.cleanup()


def ctl(server: EtcdServer, certs: Certificates, *args: str) -> str:
    done = server.etcdctl(*tls_args(certs), f"--user=root:{PASSWORD}", *args, timeout=10)
    assert done.returncode == 0, f"etcdctl {args} failed: {done.stderr}"
    return done.stdout


@pytest.fixture
async def make(tls_etcd: EtcdServer, certs: Certificates) -> AsyncIterator[Callable[..., EtcdElector]]:
    """make(identity, name, **options): a correctly configured TLS elector (options override), closed at the end."""
    made: list[EtcdElector] = []

    def build(identity: str, name: str, **options: Any) -> EtcdElector:
        settings: dict[str, Any] = {
            "ca_file": certs.ca,
            "cert_file": certs.client_cert,
            "key_file": certs.client_key,
            "username": "root",
            "password": PASSWORD,
            "ttl": 2,
        }
        settings.update(options)
        endpoints = settings.pop("endpoints", [f"https://{tls_etcd.endpoint}"])
        elector = EtcdElector(endpoints, name=name, identity=identity, **settings)
        made.append(elector)
        return elector

    yield build
    for elector in made:
        await elector.aclose()


def election() -> str:
    return "/" + unique_name("tls")


async def refused(elector: EtcdElector) -> tuple[str, float]:
    """acquire() must fail with ElectionError, bounded; return its message and how long it took."""
    started = time.monotonic()
    with anyio.fail_after(REFUSAL_BOUND + 2), pytest.raises(ElectionError) as info:
        await elector.acquire()
    took = time.monotonic() - started
    assert took < REFUSAL_BOUND, f"the refusal took {took:.1f}s"
    assert not elector.leading
    return str(info.value), took


# --- construction --------------------------------------------------------------------------


def test_tls_options_are_validated(certs: Certificates, tmp_path: Path) -> None:
    ep = "127.0.0.1:2379"
    with pytest.raises(ValueError, match=r"ca_file .* does not exist"):
        EtcdElector(ep, ca_file=str(tmp_path / "nope.pem"), name="/t")
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        EtcdElector(ep, cert_file=certs.client_cert, name="/t")
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        EtcdElector(ep, ca_file=certs.ca, key_file=certs.client_key, name="/t")
    with pytest.raises(ValueError, match="mix http:// and https://"):
        EtcdElector(["https://127.0.0.1:1", "http://127.0.0.1:2"], name="/t")
    with pytest.raises(ValueError, match="plain HTTP but ca_file"):
        EtcdElector("http://127.0.0.1:2379", ca_file=certs.ca, name="/t")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="no usable PEM CA"):
        EtcdElector(ep, ca_file=str(garbage), name="/t")
    with pytest.raises(ValueError, match="cannot load the client certificate"):
        # the key of another certificate
        EtcdElector(ep, cert_file=certs.client_cert, key_file=certs.server_key, name="/t")
    # https:// alone (system CAs), or a scheme-less endpoint with TLS files, are TLS.
    assert [e.scheme for e in parse_endpoints("https://a:1,https://b:2")] == ["https", "https"]
    EtcdElector("https://127.0.0.1:2379", name="/t")
    elector = EtcdElector(ep, ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key, name="/t")
    assert "https://127.0.0.1:2379" in elector._backend.describe_timing()


# --- the right setup -----------------------------------------------------------------------


async def test_right_ca_client_certificate_and_password_elect(
    make: Callable[..., EtcdElector], tls_etcd: EtcdServer, certs: Certificates
) -> None:
    name = election()
    a, b = make("tls-a", name), make("tls-b", name)
    seen: list[str | None] = []

    async def watch() -> None:
        async for who in b.observe():
            seen.append(who)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        with anyio.fail_after(10):
            lead = await a.acquire()
        assert lead.held and await a.leader() == "tls-a" and await b.leader() == "tls-a"
        # etcdctl over TLS sees our key: the election really lives in this etcd.
        listed = await anyio.to_thread.run_sync(lambda: ctl(tls_etcd, certs, "get", "--prefix", name + "/"))
        assert "tls-a" in listed
        follower = Follower(b)
        await asyncio.sleep(0.5)
        assert not follower.won.is_set()
        await lead.release()
        second = await follower.wait(timeout=5)
        assert second.token is not None and lead.token is not None and second.token > lead.token
        assert await a.leader() == "tls-b"
        with anyio.fail_after(5):
            while seen[-1:] != ["tls-b"]:
                await asyncio.sleep(0.05)
        tg.cancel_scope.cancel()
    await follower.close()
    assert "tls-a" in seen and seen[-1] == "tls-b"


async def test_system_cas_are_used_without_ca_file(
    make: Callable[..., EtcdElector], certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    # OpenSSL's default CA file honours SSL_CERT_FILE: here "the system CAs" are our test CA.
    monkeypatch.setenv("SSL_CERT_FILE", certs.ca)
    elector = make("sys-ca", election(), ca_file=None)
    with anyio.fail_after(10):
        lead = await elector.acquire()
    assert await elector.leader() == "sys-ca"
    await lead.release()


async def test_failover_between_endpoints_stays_on_tls(
    make: Callable[..., EtcdElector], tls_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A reconnection (the first endpoint drops every connection) opens a new TLS channel on the next."""
    caplog.set_level(logging.DEBUG, logger="aioelect")
    with TCPProxy(tls_etcd.host, tls_etcd.port) as proxy:
        elector = make("failover", election(), endpoints=[f"https://{proxy.endpoint}", f"https://{tls_etcd.endpoint}"])
        with anyio.fail_after(10):
            lead = await elector.acquire()
        proxy.drop()
        # Keep-alives (every ttl/3) fail over to the direct endpoint before the renew deadline.
        await asyncio.sleep(3)
        assert lead.held, lead.lost_reason
        assert await elector.leader() == "failover"
        await lead.release()
    # It did move: a new (TLS: the port speaks nothing else) channel to the direct endpoint.
    assert f"connected to etcd at {tls_etcd.endpoint}" in caplog.text


async def test_a_long_campaign_survives_auth_token_expiry(
    make: Callable[..., EtcdElector], caplog: pytest.LogCaptureFixture
) -> None:
    """etcd issue 17623: a follower waiting longer than the token TTL still takes over."""
    caplog.set_level(logging.DEBUG, logger="aioelect")
    name = election()
    leader, follower = make("first", name), make("patient", name)
    with anyio.fail_after(10):
        lead = await leader.acquire()
    waiting = Follower(follower)
    await asyncio.sleep(TOKEN_TTL * 4)  # the follower's token, idle while it waits, expires
    assert not waiting.won.is_set()
    await lead.release()
    started = time.monotonic()
    second = await waiting.wait(timeout=10)
    took = time.monotonic() - started
    print(f"takeover after the token expired: {took:.3f}s")
    assert second.held and await leader.leader() == "patient"
    await waiting.close()
    # The token did expire on the way (keep-alives and watches do not refresh it) and was renewed.
    assert any("patient" in r.getMessage() and "invalid auth token" in r.getMessage() for r in caplog.records), (
        "the follower's token never expired: the test proved nothing"
    )


async def test_client_certificate_as_identity_with_least_privilege(
    make: Callable[..., EtcdElector], tls_etcd: EtcdServer, certs: Certificates
) -> None:
    """Without a password etcd takes the certificate's CN as the user; a role on the prefix is all it needs."""
    prefix = election()
    user = certs.client_cn
    for args in (
        ("role", "add", "elector"),
        ("role", "grant-permission", "elector", "readwrite", "--prefix=true", prefix + "/"),
        ("user", "add", f"{user}:unused-{os.getpid()}"),
        ("user", "grant-role", user, "elector"),
    ):
        await anyio.to_thread.run_sync(functools.partial(ctl, tls_etcd, certs, *args))
    try:
        elector = make("by-cert", prefix, username=None, password=None, degrade_to_local=False)
        with anyio.fail_after(10):
            lead = await elector.acquire()
        assert await elector.leader() == "by-cert"
        await lead.release()
        outside = make("by-cert", election(), username=None, password=None, degrade_to_local=False)
        message, _ = await refused(outside)
        assert "permission denied" in message
    finally:
        for args in (("user", "delete", user), ("role", "delete", "elector")):
            await anyio.to_thread.run_sync(functools.partial(ctl, tls_etcd, certs, *args))


# --- refusals ------------------------------------------------------------------------------


async def test_wrong_ca_is_refused_clearly_and_never_degrades(
    make: Callable[..., EtcdElector], certs: Certificates
) -> None:
    elector = make("wrong-ca", election(), ca_file=certs.other_ca, degrade_to_local=True)
    message, took = await refused(elector)
    assert "does not accept" in message and certs.other_ca in message, message
    print(f"wrong CA refused after {took:.3f}s: {message}")
    # Not "unreachable": leader() says why, too.
    with anyio.fail_after(REFUSAL_BOUND), pytest.raises(ElectionError, match="does not accept"):
        await elector.leader()


async def test_missing_client_certificate_is_refused_clearly(make: Callable[..., EtcdElector]) -> None:
    elector = make("no-cert", election(), cert_file=None, key_file=None, degrade_to_local=True)
    message, took = await refused(elector)
    assert "requires a client certificate" in message, message
    print(f"missing client certificate refused after {took:.3f}s: {message}")


@pytest.fixture(scope="module")
def stranger(certs: Certificates) -> tuple[str, str]:
    """(certificate, key) of a client signed by the unrelated CA, which etcd's --trusted-ca-file does not hold."""
    openssl = require_binary("openssl")
    key, csr, cert = (os.path.join(certs.directory, f"stranger.{ext}") for ext in ("key", "csr", "pem"))
    other_key = os.path.join(certs.directory, "other-ca-key.pem")
    for argv in (
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=stranger", "-keyout", key, "-out", csr],
        ["x509", "-req", "-in", csr, "-CA", certs.other_ca, "-CAkey", other_key, "-CAcreateserial", "-days", "1"],
    ):
        subprocess.run([openssl, *argv, *(["-out", cert] if argv[0] == "x509" else [])], check=True, timeout=30)
    return cert, key


async def test_untrusted_client_certificate_is_refused_clearly(
    make: Callable[..., EtcdElector], stranger: tuple[str, str]
) -> None:
    cert, key = stranger
    elector = make("stranger", election(), cert_file=cert, key_file=key, degrade_to_local=True)
    message, _ = await refused(elector)
    assert "refused our client certificate" in message and cert in message, message


async def test_wrong_password_is_refused(make: Callable[..., EtcdElector]) -> None:
    elector = make("bad-pw", election(), password=PASSWORD + "-wrong", degrade_to_local=True)
    message, _ = await refused(elector)
    assert "rejected the credentials of user 'root'" in message, message


async def test_plain_http_against_the_tls_port_is_refused(
    make: Callable[..., EtcdElector], tls_etcd: EtcdServer
) -> None:
    for endpoint in (tls_etcd.endpoint, f"http://{tls_etcd.endpoint}"):
        plain: dict[str, Any] = {"ca_file": None, "cert_file": None, "key_file": None}
        elector = make("plain", election(), endpoints=[endpoint], degrade_to_local=True, **plain)
        message, took = await refused(elector)
        assert "requires TLS: use https://" in message, message
        print(f"plain HTTP to the TLS port refused after {took:.3f}s")


async def test_tls_against_a_plain_server_is_refused(make: Callable[..., EtcdElector], etcd: EtcdServer) -> None:
    elector = make("tls-to-plain", election(), endpoints=[f"https://{etcd.endpoint}"], username=None, password=None)
    message, _ = await refused(elector)
    assert "does not speak TLS" in message, message


async def test_an_unreachable_endpoint_is_still_transient(make: Callable[..., EtcdElector]) -> None:
    """A TLS elector whose etcd is down waits (or degrades) as before: nothing there to diagnose."""
    down = f"https://127.0.0.1:{free_port()}"
    elector = make("down", election(), endpoints=[down], degrade_to_local=False, connect_timeout=1)
    with pytest.raises(BackendUnavailable):
        await elector.leader()
    with anyio.move_on_after(2) as scope:
        await elector.acquire()
    assert scope.cancelled_caught  # still campaigning: it did not give up


# --- secrets -----------------------------------------------------------------------------------


async def test_password_never_appears_in_logs_reprs_events_or_errors(
    make: Callable[..., EtcdElector], certs: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aioelect")
    seen: list[str] = []
    cases: list[dict[str, Any]] = [
        {},
        {"password": PASSWORD + "-wrong"},
        {"ca_file": certs.other_ca},
        {"cert_file": None, "key_file": None},
    ]
    for options in cases:
        elector = make("secretive", election(), degrade_to_local=True, **options)
        elector.add_listener(lambda event: seen.append(repr(event)))
        seen.append(repr(elector))
        seen.append(elector._backend.describe_timing())
        try:
            with anyio.fail_after(REFUSAL_BOUND):
                lead = await elector.acquire()
            seen.append(repr(lead))
            seen.append(str(await elector.leader()))
            await lead.release()
        except ElectionError as exc:
            seen.extend((str(exc), repr(exc), repr(exc.__cause__), repr(exc.__context__)))
    seen.append(caplog.text)
    seen.extend(repr(r.__dict__) for r in caplog.records)
    text = "\n".join(seen)
    # The failures were captured...
    assert "rejected the credentials" in text and "does not accept" in text and "client certificate" in text
    # ...and the password never was.
    assert PASSWORD not in text


# --- plaintext on the network ------------------------------------------------------------------


def connection(elector: EtcdElector) -> Connection:
    backend = elector._backend
    assert isinstance(backend, EtcdBackend)
    return backend.conn


def test_plain_http_to_a_host_that_is_not_loopback_warns_once(
    certs: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    """The decision, and its one WARNING per elector, without sending anything to a host that is not loopback."""
    caplog.set_level(logging.DEBUG, logger="aioelect")
    conn = connection(
        EtcdElector(["etcd-1.example:2379", "http://127.0.0.1:2379"], username="root", password=PASSWORD, name="/t")
    )
    warning = conn.transport_warning()
    assert warning is not None and "etcd-1.example:2379" in warning and "not encrypted" in warning
    assert "127.0.0.1" not in warning and "https://" in warning, warning
    for _ in range(3):
        conn.warn_transport()
    warned = [r for r in caplog.records if "not encrypted" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING], "exactly one WARNING per elector"
    assert PASSWORD not in caplog.text
    for quiet in (["127.0.0.1:2379"], ["localhost:2379", "http://127.8.9.10:23790"], ["[::1]:2379", "LOCALHOST:1"]):
        assert connection(EtcdElector(quiet, name="/t")).transport_warning() is None, quiet
    # TLS always verifies the server (there is no option to skip it): nothing to warn about.
    assert (
        connection(EtcdElector(["https://etcd-1.example:2379"], ca_file=certs.ca, name="/t")).transport_warning()
        is None
    )


async def test_plain_http_to_loopback_connects_without_a_transport_warning(
    etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aioelect")
    async with EtcdElector(etcd.endpoints, name=election(), ttl=2) as elector:
        with anyio.fail_after(5):
            lead = await elector.acquire()
        await lead.release()
        assert connection(elector)._transport_checked, "the check ran on the way to a real connection"
    assert not any("not encrypted" in r.getMessage() for r in caplog.records)
