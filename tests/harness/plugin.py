"""The harness's pytest fixtures and report lines; tests/conftest.py registers this plugin.

Session fixtures (``mariadb``, ``etcd``, ``postgres``, ``redis_server``) are shared: never kill
or freeze them, use the ``fresh_*`` ones for that. The DSN fixtures
(``mysql_dsn``, ``etcd_endpoints``, ``postgres_dsn``, ``redis_url``) take an external server
from ``AIOELECT_MYSQL_DSN`` / ``AIOELECT_ETCD_ENDPOINTS`` /
``AIOELECT_POSTGRES_DSN`` when one is set.

A server that is not installed skips its tests, except when servers are
required (``CI`` or ``AIOELECT_REQUIRE_SERVERS``): then it fails them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar

import pytest

from .binaries import ENV_ETCD_DIR, ENV_ETCD_VERSION, etcd_tool_version, require_binary
from .certificates import Certificates
from .errors import HarnessError, MissingBinaryError
from .lifecycle import Started
from .proxy import TCPProxy
from .servers.etcd import EtcdCluster, EtcdServer, started_etcd_versions
from .servers.mariadb import MariaDBServer
from .servers.pgbouncer import PgBouncer
from .servers.postgres import PostgresServer
from .servers.redis import RedisServer

__all__ = [
    "ENV_ETCD_ENDPOINTS",
    "ENV_MYSQL_DSN",
    "ENV_POSTGRES_DSN",
    "ENV_REDIS_URL",
    "ENV_REQUIRE_SERVERS",
    "external_server",
    "server_unavailable",
    "servers_required",
    "skip_if_external",
]

_S = TypeVar("_S", bound=Started)

ENV_MYSQL_DSN = "AIOELECT_MYSQL_DSN"
ENV_ETCD_ENDPOINTS = "AIOELECT_ETCD_ENDPOINTS"
ENV_POSTGRES_DSN = "AIOELECT_POSTGRES_DSN"
ENV_REDIS_URL = "AIOELECT_REDIS_URL"
ENV_REQUIRE_SERVERS = "AIOELECT_REQUIRE_SERVERS"

_EXTERNAL_ENV = {
    "mysql": ENV_MYSQL_DSN,
    "mariadb": ENV_MYSQL_DSN,
    "etcd": ENV_ETCD_ENDPOINTS,
    "postgres": ENV_POSTGRES_DSN,
    "redis": ENV_REDIS_URL,
}


def servers_required() -> bool:
    """True when missing server binaries must fail tests instead of skipping them.

    That is when ``CI`` is ``true``/``1``/``yes`` or ``AIOELECT_REQUIRE_SERVERS=1``.
    """
    ci = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")
    required = os.environ.get(ENV_REQUIRE_SERVERS, "").strip().lower() in ("1", "true", "yes")
    return ci or required


def external_server(kind: str) -> str | None:
    """The external server configured for ``kind`` (``mysql``/``etcd``/``postgres``), or None."""
    value = os.environ.get(_EXTERNAL_ENV[kind], "").strip()
    return value or None


def server_unavailable(reason: str) -> NoReturn:
    """Skip the current test, or fail it when :func:`servers_required` (CI)."""
    if servers_required():
        pytest.fail(f"{reason} (servers are required: CI / {ENV_REQUIRE_SERVERS} is set)", pytrace=False)
    pytest.skip(reason)


def skip_if_external(kind: str) -> None:
    """Skip a test that needs a local, controllable server when ``kind`` is external.

    Fault-injection tests (kill/freeze/restart) cannot run against a
    server given by ``AIOELECT_MYSQL_DSN`` / ``AIOELECT_ETCD_ENDPOINTS`` /
    ``AIOELECT_POSTGRES_DSN``; this is a deliberate configuration, so it
    skips even in CI.
    """
    value = external_server(kind)
    if value is not None:
        pytest.skip(f"{_EXTERNAL_ENV[kind]} is set: test needs a local {kind} server it can control")


def _serve(factory: Callable[[], _S]) -> Iterator[_S]:
    try:
        server = factory()
    except MissingBinaryError as exc:
        server_unavailable(str(exc))
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


def _dsn(request: pytest.FixtureRequest, kind: str, fixture: str) -> str:
    """The external server's DSN for ``kind`` if one is set, else that of the session ``fixture``."""
    value = external_server(kind)
    return value if value is not None else str(request.getfixturevalue(fixture).dsn)


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    """Session-wide local MariaDB (do not kill/freeze it: use ``fresh_mariadb``)."""
    skip_if_external("mysql")
    yield from _serve(MariaDBServer)


@pytest.fixture(scope="session")
def mysql_dsn(request: pytest.FixtureRequest) -> str:
    """``AIOELECT_MYSQL_DSN`` if set, else the DSN of the session ``mariadb``."""
    return _dsn(request, "mysql", "mariadb")


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdServer]:
    """Session-wide local single-member etcd (do not kill/freeze it: use ``fresh_etcd``)."""
    skip_if_external("etcd")
    yield from _serve(EtcdServer)


@pytest.fixture(scope="session")
def etcd_endpoints(request: pytest.FixtureRequest) -> list[str]:
    """``AIOELECT_ETCD_ENDPOINTS`` (comma-separated) if set, else the session ``etcd``'s."""
    value = external_server("etcd")
    if value is not None:
        return [e.strip() for e in value.split(",") if e.strip()]
    server: EtcdServer = request.getfixturevalue("etcd")
    return server.endpoints


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """Session-wide local PostgreSQL (do not kill/freeze it: use ``fresh_postgres``)."""
    skip_if_external("postgres")
    yield from _serve(PostgresServer)


@pytest.fixture(scope="session")
def postgres_dsn(request: pytest.FixtureRequest) -> str:
    """``AIOELECT_POSTGRES_DSN`` if set, else the DSN of the session ``postgres``."""
    return _dsn(request, "postgres", "postgres")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """Session-wide local Redis with ``appendfsync always`` (do not kill/freeze it: use ``fresh_redis``)."""
    skip_if_external("redis")
    yield from _serve(RedisServer)


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """``AIOELECT_REDIS_URL`` if set, else the URL of the session ``redis_server``."""
    value = external_server("redis")
    return value if value is not None else str(request.getfixturevalue("redis_server").url)


@pytest.fixture
def fresh_redis() -> Iterator[RedisServer]:
    """A private Redis (``appendfsync always``) for one test; kill/freeze/restart it freely."""
    yield from _serve(RedisServer)


@pytest.fixture
def fresh_mariadb() -> Iterator[MariaDBServer]:
    """A private MariaDB for one test; kill/freeze/restart it freely."""
    yield from _serve(MariaDBServer)


@pytest.fixture
def fresh_etcd() -> Iterator[EtcdServer]:
    """A private single-member etcd for one test; kill/freeze/restart it freely."""
    yield from _serve(EtcdServer)


@pytest.fixture
def fresh_postgres() -> Iterator[PostgresServer]:
    """A private PostgreSQL for one test; kill/freeze/restart it freely."""
    yield from _serve(PostgresServer)


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A private, started three-member etcd cluster for one test."""
    yield from _serve(lambda: EtcdCluster(3))


@pytest.fixture(scope="module")
def certs() -> Iterator[Certificates]:
    """A CA with server (127.0.0.1) and client certificates for one test module, removed afterwards."""
    try:
        certificates = Certificates()
    except MissingBinaryError as exc:
        server_unavailable(str(exc))
    try:
        yield certificates
    finally:
        certificates.cleanup()


@pytest.fixture
def pgbouncer_factory(postgres: PostgresServer) -> Iterator[Callable[[str], PgBouncer]]:
    """``make(pool_mode) -> PgBouncer``, started in front of the session ``postgres``; stopped after the test."""
    skip_if_external("postgres")
    poolers: list[PgBouncer] = []

    def make(pool_mode: str) -> PgBouncer:
        assert pool_mode in ("session", "transaction", "statement")
        try:
            pooler = PgBouncer(postgres, pool_mode)  # type: ignore[arg-type]
        except MissingBinaryError as exc:
            server_unavailable(str(exc))
        poolers.append(pooler)
        pooler.start()
        return pooler

    try:
        yield make
    finally:
        for pooler in poolers:
            pooler.cleanup()


@pytest.fixture
def tcp_proxy_factory() -> Iterator[Callable[[str, int], TCPProxy]]:
    """``make(host, port) -> TCPProxy``; every proxy made is closed after the test."""
    proxies: list[TCPProxy] = []

    def make(host: str, port: int) -> TCPProxy:
        proxy = TCPProxy(host, port)
        proxies.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.close()


def _etcd_tools_line() -> str:
    """Which ``etcd``/``etcdctl`` the harness uses, and their versions (errors are shown, not raised)."""
    parts = []
    for tool in ("etcd", "etcdctl"):
        try:
            path = require_binary(tool)
            parts.append(f"{tool} {etcd_tool_version(path, tool)} ({path})")
        except HarnessError as exc:
            parts.append(f"{tool}: {exc}")
    pinned = [f"{env}={os.environ[env]}" for env in (ENV_ETCD_DIR, ENV_ETCD_VERSION) if os.environ.get(env)]
    return "tests.harness etcd: " + ", ".join(parts) + (f" [{' '.join(pinned)}]" if pinned else "")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The etcd version under test, in the header of every run (hidden by ``-q``)."""
    return [_etcd_tools_line()]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The etcd versions that really ran, at the end of every run (``-q`` too) that started one."""
    started = started_etcd_versions()
    if started:
        ran = ", ".join(f"etcd {version} ({path})" for path, version in sorted(started.items()))
        terminalreporter.write_line(f"tests.harness started: {ran}")
