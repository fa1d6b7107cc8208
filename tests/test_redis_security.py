"""Redis through Sentinel and with the least-privilege ACL: who receives the password, and what the user can read.

A hostile Sentinel here is a tiny RESP server on loopback that names another
loopback address as the master; the "master" there records every byte it
receives. Real ``redis-server`` processes (a Sentinel with its own password
and TLS, a master with ``requirepass``) check that the documented settings
work.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from aioelect import BackendUnavailable, PermanentBackendError, RedisElector
from aioelect.backends.redis import RedisBackend
from aioelect.backends.redis._options import RedisSettings
from aioelect.wiring._settings import Settings

from .backends import REDIS, unique_name
from .harness import Certificates, RedisServer, SentinelServer, redis_command
from .harness.processes import run_bounded

MASTER_PW = "MasterPw"
SENTINEL_PW = "SentPw"
#: A second loopback address: the "master" a hostile Sentinel names (loopback only, as every test).
OTHER = "127.0.0.2"

Reply = Callable[[list[str]], bytes]


def _bulk(items: list[str]) -> bytes:
    return b"*%d\r\n" % len(items) + b"".join(b"$%d\r\n%s\r\n" % (len(i.encode()), i.encode()) for i in items)


class FakeServer:
    """A tiny RESP server on ``host`` in a thread of its own: answers each command with ``reply(args)``, records
    every byte it receives (after TLS, if a client starts a handshake and ``tls`` is given) and every connection."""

    def __init__(self, host: str, reply: Reply, tls: ssl.SSLContext | None = None) -> None:
        self.reply = reply
        self.tls = tls
        self.received = bytearray()
        self.connections = 0
        self._stop = threading.Event()
        self._sock = socket.create_server((host, 0))
        self._sock.settimeout(0.1)
        self.host, self.port = host, self._sock.getsockname()[1]
        self._threads = [threading.Thread(target=self._serve, daemon=True)]
        self._threads[0].start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            thread = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            if self.tls is not None and conn.recv(1, socket.MSG_PEEK) == b"\x16":
                conn = self.tls.wrap_socket(conn, server_side=True)
            f = conn.makefile("rb")
            while not self._stop.is_set():
                line = f.readline()
                if not line:
                    return
                self.received += line
                if not line.startswith(b"*"):
                    continue
                args = []
                for _ in range(int(line[1:])):
                    size = f.readline()
                    data = f.read(int(size[1:]) + 2)
                    self.received += size + data
                    args.append(data[:-2].decode(errors="replace"))
                conn.sendall(self.reply(args))
        except (OSError, ValueError):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        for thread in self._threads:
            thread.join(timeout=6)


def ok(args: list[str]) -> bytes:
    """A "master" that says yes to everything."""
    return b"+OK\r\n"


def naming(host: str, port: int) -> Reply:
    """A "Sentinel" that names ``host:port`` as master ``aioelect``."""

    def reply(args: list[str]) -> bytes:
        command = [a.lower() for a in args[:2]]
        if command == ["sentinel", "masters"]:
            state = ["name", "aioelect", "ip", host, "port", str(port), "flags", "master"]
            return b"*1\r\n" + _bulk([*state, "num-other-sentinels", "2", "quorum", "2"])
        if command == ["sentinel", "get-master-addr-by-name"]:
            return _bulk([host, str(port)])
        if command[:1] in (["auth"], ["ping"]):
            return b"+PONG\r\n" if command[0] == "ping" else b"+OK\r\n"
        return b"-ERR unknown command\r\n"

    return reply


def server_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def issue(certs: Certificates, ip: str) -> tuple[str, str]:
    """A server certificate for ``ip`` from the same CA as the real servers' (as any host of the network has)."""
    d = certs.directory
    cert, key, ext = (os.path.join(d, f"{ip}{suffix}") for suffix in (".pem", "-key.pem", ".ext"))
    with open(ext, "w") as f:
        f.write(f"subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth\n")
    log = os.path.join(d, "issue.log")
    run_bounded(
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={ip}", "-keyout", key,
         "-out", cert + ".csr"],
        log_path=log, timeout=60.0, what="openssl req",
    )  # fmt: skip
    run_bounded(
        ["openssl", "x509", "-req", "-in", cert + ".csr", "-CA", certs.ca, "-CAkey", certs.ca_key, "-CAcreateserial",
         "-days", "2", "-out", cert, "-extfile", ext],
        log_path=log, timeout=60.0, what="openssl x509",
    )  # fmt: skip
    return cert, key


@pytest.fixture
def servers() -> Iterator[list[FakeServer]]:
    started: list[FakeServer] = []
    yield started
    for server in started:
        server.close()


# --- the master a Sentinel names ----------------------------------------------------------------


async def test_a_tls_master_named_by_a_sentinel_gets_no_password_without_the_configured_name(
    certs: Certificates, servers: list[FakeServer]
) -> None:
    """The hostile master holds a certificate from the same CA, for its own address: that proves nothing."""
    master = FakeServer(OTHER, ok, server_context(*issue(certs, OTHER)))
    sentinel = FakeServer("127.0.0.1", naming(OTHER, master.port), server_context(certs.server_cert, certs.server_key))
    servers += [master, sentinel]
    url = f"rediss+sentinel://elect:{MASTER_PW}@127.0.0.1:{sentinel.port}/aioelect/0?ssl_ca_certs={certs.ca}"
    async with RedisElector(url, name=unique_name(), **REDIS) as elector:  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises((PermanentBackendError, BackendUnavailable, TimeoutError)) as caught:
            await elector.acquire(timeout=5)
    assert sentinel.received, "the Sentinel was asked"
    assert MASTER_PW.encode() not in master.received and b"AUTH" not in master.received.upper()
    assert not master.received, f"the unverified master received {bytes(master.received)!r}"
    # Verified against the master's name in the URL, never the address the Sentinel named: refused at once.
    assert isinstance(caught.value, PermanentBackendError), caught.value
    assert "TLS handshake failed" in str(caught.value) and "'aioelect'" in str(caught.value)
    assert time.monotonic() - started < 4
    assert MASTER_PW not in str(caught.value)


async def test_a_sentinel_whose_certificate_does_not_name_its_host_is_not_asked(
    certs: Certificates, servers: list[FakeServer]
) -> None:
    """rediss+sentinel:// is TLS to the Sentinels, verified against their host names as the URL writes them."""
    master = FakeServer(OTHER, ok)
    sentinel = FakeServer("127.0.0.1", naming(OTHER, master.port), server_context(*issue(certs, OTHER)))
    servers += [master, sentinel]
    url = f"rediss+sentinel://elect:{MASTER_PW}@127.0.0.1:{sentinel.port}/aioelect/0?ssl_ca_certs={certs.ca}"
    async with RedisElector(url, name=unique_name(), **REDIS) as elector:  # type: ignore[arg-type]
        with pytest.raises(PermanentBackendError, match=r"refused us: .*certificate is not valid for '127\.0\.0\.1'"):
            await elector.acquire(timeout=5)
    assert sentinel.connections > 0 and not sentinel.received, "no command before the Sentinel proved its name"
    assert master.connections == 0 and not master.received


async def test_master_hosts_keeps_an_unlisted_master_from_getting_anything(
    servers: list[FakeServer], caplog: pytest.LogCaptureFixture
) -> None:
    master = FakeServer(OTHER, ok)
    sentinel = FakeServer("127.0.0.1", naming(OTHER, master.port))
    servers += [master, sentinel]
    url = (
        f"redis+sentinel://elect:{MASTER_PW}@127.0.0.1:{sentinel.port}/aioelect/0"
        f"?master_hosts=127.0.0.1:{master.port},localhost"
    )
    caplog.set_level(logging.DEBUG)
    async with RedisElector(url, name=unique_name(), **REDIS) as elector:  # type: ignore[arg-type]
        with pytest.raises(TimeoutError):
            await elector.acquire(timeout=2)  # transient: a Sentinel that names a listed master later is followed
    assert sentinel.received
    assert master.connections == 0 and not master.received, "an unlisted master is not even connected to"
    assert f"named {OTHER}:{master.port} as master 'aioelect', an address master_hosts does not list" in caplog.text
    assert MASTER_PW not in caplog.text


def test_a_plaintext_sentinel_url_with_a_password_needs_master_hosts() -> None:
    url = f"redis+sentinel://elect:{MASTER_PW}@127.0.0.1:26379/aioelect/0"
    with pytest.raises(ValueError, match="master_hosts") as caught:
        RedisBackend(url, name="n")
    assert MASTER_PW not in str(caught.value)
    RedisBackend(url + "?master_hosts=127.0.0.1:6379", name="n")
    RedisBackend("redis+sentinel://127.0.0.1:26379/aioelect/0", name="n")  # nothing to hand over without one


async def test_a_plaintext_sentinel_url_with_a_password_sends_it_nowhere_unlisted(servers: list[FakeServer]) -> None:
    """Credentials in a plaintext Sentinel URL without master_hosts: refused before any connection."""
    master = FakeServer(OTHER, ok)
    sentinel = FakeServer("127.0.0.1", naming(OTHER, master.port))
    servers += [master, sentinel]
    url = f"redis+sentinel://elect:{MASTER_PW}@127.0.0.1:{sentinel.port}/aioelect/0"
    error: Exception | None = None
    try:
        async with RedisElector(url, name=unique_name(), **REDIS) as elector:  # type: ignore[arg-type]
            await elector.try_acquire()
    except Exception as exc:
        error = exc
    assert not master.received, f"the master a Sentinel named received {bytes(master.received)!r}"
    assert isinstance(error, ValueError) and "master_hosts" in str(error), error


# --- real Sentinels with a password and TLS -----------------------------------------------------


async def test_sentinels_with_their_own_password_and_tls(certs: Certificates, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with (
        RedisServer(tls=certs, acl=[f"elect on >{MASTER_PW} ~* &* +@all"]) as master,
        SentinelServer(master.port, tls=certs, password=SENTINEL_PW, quorum=1) as sentinel,
    ):
        base = f"rediss+sentinel://elect:{MASTER_PW}@127.0.0.1:{sentinel.port}/aioelect/0?ssl_ca_certs={certs.ca}"
        name = unique_name()
        # The master's certificate names 127.0.0.1 and localhost; the operator says which name it must carry.
        async with RedisElector(
            base + "&master_tls_name=localhost", name=name, sentinel_password=SENTINEL_PW, **REDIS
        ) as elector:  # type: ignore[arg-type]
            lead = await elector.acquire(timeout=10)
            assert lead.token is not None and await elector.leader() == elector.identity
            await lead.release()
        # master_hosts lists the address: the certificate is checked against it.
        async with RedisElector(
            base + f"&master_hosts=127.0.0.1:{master.port}", name=name, sentinel_password=SENTINEL_PW, **REDIS
        ) as elector:  # type: ignore[arg-type]
            await (await elector.acquire(timeout=10)).release()
        # Without a configured name: the master's certificate must name the master's name in the URL.
        async with RedisElector(base, name=name, sentinel_password=SENTINEL_PW, **REDIS) as elector:  # type: ignore[arg-type]
            with pytest.raises(PermanentBackendError, match=r"TLS handshake failed.*master_tls_name"):
                await elector.acquire(timeout=10)
        # The Sentinel refuses a client without its password, or with a wrong one: permanent, as for the master.
        for options in ({}, {"sentinel_password": "wrong"}):
            async with RedisElector(base + "&master_tls_name=localhost", name=name, **options, **REDIS) as elector:  # type: ignore[arg-type]
                started = time.monotonic()
                with pytest.raises(
                    PermanentBackendError, match=r"every Sentinel of .* refused us: AuthenticationError"
                ):
                    await elector.acquire(timeout=10)
                assert time.monotonic() - started < 5
        # The Sentinels are spoken to over TLS only: the plaintext form of the URL reaches nobody.
        plain = f"redis+sentinel://127.0.0.1:{sentinel.port}/aioelect/0"
        async with RedisElector(plain, name=name, sentinel_password=SENTINEL_PW, **REDIS) as elector:  # type: ignore[arg-type]
            with pytest.raises(TimeoutError):
                await elector.acquire(timeout=2)
    records = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert MASTER_PW not in records and SENTINEL_PW not in records


def test_sentinels_in_plaintext_or_without_a_password_are_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:

    def warning(url: str, **options: Any) -> str | None:
        return RedisSettings.parse(url, {"name": "n", **options}).warning()

    tls = warning("rediss+sentinel://sent.example:26379,127.0.0.1:26380/m/0")
    assert tls is not None and "sent.example:26379 are asked without a password" in tls and "127.0.0.1" not in tls
    assert "not encrypted" not in tls
    plain = warning("redis+sentinel://sent.example:26379/m/0", sentinel_password=SENTINEL_PW)
    assert plain is not None and "Sentinels at sent.example:26379 are not encrypted" in plain
    assert SENTINEL_PW not in plain
    assert warning("rediss+sentinel://sent.example:26379/m/0", sentinel_password=SENTINEL_PW) is None
    assert warning("redis+sentinel://127.0.0.1:26379,localhost:26380/m/0") is None  # loopback, as for redis://
    # From the environment (from_env() and the aioelect command read the variables into the options).
    options, _ = Settings.from_environ({"AIOELECT_REDIS_SENTINEL_PASSWORD": SENTINEL_PW}).backend_options("redis")
    settings = RedisSettings.parse("rediss+sentinel://sent.example:26379/m/0", {"name": "n", **options})
    assert settings.sentinel_password == SENTINEL_PW and settings.warning() is None
    assert SENTINEL_PW not in repr(settings)
    # The master's own link is judged when a Sentinel names it, as redis:// to that host would be.
    backend = RedisBackend("redis+sentinel://127.0.0.1:26379/m/0", name="n")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            backend._master_named("10.0.0.5")
        backend._master_named("127.0.0.1")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "connection to 10.0.0.5 is not encrypted" in warnings[0], warnings
    tls_backend = RedisBackend("rediss+sentinel://127.0.0.1:26379/m/0", name="n")
    assert tls_backend.settings.master_warning("10.0.0.5") is None


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://u:6380/Pw5ecret@sent.example:26379/0",
        "redis+sentinel://u:6380?Pw5ecret@sent.example:26379/mymaster/0",
        "redis+cluster://u:6380/Pw5ecret@node.example:6379/",
    ],
)
def test_a_sentinel_or_cluster_url_with_an_unencoded_slash_in_the_password_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="ambiguous") as caught:
        RedisBackend(url, name="n")
    assert "Pw5ecret" not in str(caught.value) and "6380" not in str(caught.value)


def test_the_redis_url_form_is_refused_the_same_way() -> None:
    with pytest.raises(ValueError, match="ambiguous") as caught:
        RedisBackend("redis://u:6380/Pw5ecret@sent.example:26379/0", name="n")
    assert "Pw5ecret" not in str(caught.value)


# --- the least-privilege ACL --------------------------------------------------------------------


def documented_acl() -> list[str]:
    """The ``ACL SETUSER`` arguments exactly as docs/backends.md gives them (its password ``PASSWORD``)."""
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "backends.md")) as f:
        page = f.read()
    section = page[page.index("**The least privilege**") :]
    block = re.search(r"```[a-z]*\n(ACL SETUSER .*?)```", section, re.S)
    assert block is not None
    words = block.group(1).split()
    assert words[:2] == ["ACL", "SETUSER"]
    return words[2:]


async def test_the_documented_acl_reads_no_secret_and_elects(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    acl = documented_acl()
    with RedisServer() as server:
        admin = "Adm1nPw"
        server.command("CONFIG", "SET", "masterauth", "MasterAuthPw")
        server.command("CONFIG", "SET", "requirepass", admin)

        def as_admin(*args: Any) -> Any:
            return redis_command(server.port, *args, password=admin)

        assert as_admin("ACL", "SETUSER", *acl) == "OK"
        user = acl[0]
        for pattern in ("*pass*", "master*", "requirepass", "*"):
            with pytest.raises(RuntimeError, match="NOPERM"):
                redis_command(server.port, "CONFIG", "GET", pattern, user=user, password="PASSWORD")
        as_admin("ACL", "LOG", "RESET")
        base = f"redis://{user}:PASSWORD@127.0.0.1:{server.port}/0"
        name = unique_name()
        # Redis 7.0 and 7.1 have no WAITAOF: appendfsync, which only CONFIG GET shows, is stated by the operator.
        stated = base + "?assume_appendfsync=always&assume_timeout=0"
        async with RedisElector(stated, name=name, **REDIS) as a, RedisElector(stated, name=name, **REDIS) as b:  # type: ignore[arg-type]
            lead = await a.acquire(timeout=5)
            assert await b.try_acquire() is None and await b.leader() == a.identity
            await lead.release()
            lead = await b.acquire(timeout=5)
            assert lead.token is not None
            await lead.release()
        logged = [
            r for r in caplog.records if "as the URL states them: appendfsync always, timeout 0" in r.getMessage()
        ]
        assert len(logged) == 2, "logged once per elector"
        denied = [entry for entry in as_admin("ACL", "LOG") if "config" in str(entry).lower()]
        assert not denied, f"the elector asked for CONFIG GET although the URL states what it would read: {denied}"
        version = as_admin("INFO", "server")
        if "redis_version:7.0." in version or "redis_version:7.1." in version:
            async with RedisElector(base + "?assume_timeout=0", name=name, **REDIS) as elector:  # type: ignore[arg-type]
                with pytest.raises(PermanentBackendError, match="assume_appendfsync=always"):
                    await elector.acquire(timeout=5)
        # What INFO shows is read, never taken from the URL: an evicting server is refused.
        as_admin("CONFIG", "SET", "maxmemory", "100mb")
        as_admin("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
        async with RedisElector(stated, name=name, **REDIS) as elector:  # type: ignore[arg-type]
            with pytest.raises(PermanentBackendError, match="maxmemory-policy allkeys-lru"):
                await elector.acquire(timeout=5)
        as_admin("CONFIG", "SET", "maxmemory", "0")
        as_admin("CONFIG", "SET", "appendonly", "no")
        async with RedisElector(stated, name=name, **REDIS) as elector:  # type: ignore[arg-type]
            with pytest.raises(PermanentBackendError, match="appendonly no"):
                await elector.acquire(timeout=5)


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("redis://h/0?master_hosts=h2", {}, "unsupported Redis URL parameter 'master_hosts'"),
        ("redis+sentinel://s:26379/m/0?master_tls_name=x", {}, "master_tls_name needs a rediss"),
        ("redis+sentinel://s:26379/m/0?master_hosts=", {}, "master_hosts must list host"),
        ("redis+sentinel://s:26379/m/0?master_hosts=u:p@h", {}, "ambiguous"),
        ("redis+sentinel://s:26379/m/0?master_hosts=h:99999", {}, "port must be a number"),
        ("redis://h/0", {"sentinel_password": "x"}, "need a redis\\+sentinel:// URL"),
        ("redis+sentinel://s:26379/m/0", {"sentinel_username": "u"}, "sentinel_username needs sentinel_password"),
        ("redis+sentinel://s:26379/m/0", {"sentinel_password": ""}, "non-empty string"),
        ("redis://h/0?assume_appendfsync=sometimes", {}, "assume_appendfsync must be one of always"),
        ("redis://h/0?assume_timeout=-1", {}, "assume_timeout must be"),
    ],
)
def test_the_new_settings_are_validated(url: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisSettings.parse(url, {"name": "n", **options})


def test_master_hosts_and_the_name_a_master_must_carry() -> None:
    settings = RedisSettings.parse(
        "rediss+sentinel://s:26379/jobs/0?master_hosts=10.0.0.1:6379,redis-b,[::1]:6380", {"name": "n"}
    )
    assert settings.master_hosts == (("10.0.0.1", 6379), ("redis-b", None), ("::1", 6380))
    assert settings.master_admitted("10.0.0.1", 6379) and not settings.master_admitted("10.0.0.1", 6380)
    assert settings.master_admitted("REDIS-B", 1234) and settings.master_admitted("::1", 6380)
    assert not settings.master_admitted("10.0.0.2", 6379)
    assert settings.master_tls_host("10.0.0.1") == "10.0.0.1"  # listed by the operator
    named = RedisSettings.parse("rediss+sentinel://s:26379/jobs/0?master_tls_name=redis.internal", {"name": "n"})
    assert named.master_tls_host("10.9.9.9") == "redis.internal"
    bare = RedisSettings.parse("rediss+sentinel://s:26379/jobs/0", {"name": "n"})
    assert bare.master_tls_host("10.9.9.9") == "jobs", "never the address a Sentinel's reply gives"


@pytest.mark.parametrize(
    "query",
    [
        "master_hosts=10.0.0.1/6379",  # a typo for :6379 would otherwise allow every port of the host
        "master_hosts=10.0.0.1%2F..",
        "master_hosts=%2010.0.0.1",
        "master_hosts=10.0.0.1:6379,",
        "master_tls_name=",
        "master_tls_name=redis-jobs:6379",
    ],
)
def test_a_master_host_or_tls_name_that_is_not_exactly_a_name_or_address_is_refused(query: str) -> None:
    scheme = "rediss" if query.startswith("master_tls_name") else "redis"
    with pytest.raises(ValueError, match=r"master_hosts must list|master_tls_name must be"):
        RedisSettings.parse(f"{scheme}+sentinel://127.0.0.1:26379/m/0?{query}", {"name": "n"})
