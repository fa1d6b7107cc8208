"""compose.yaml stays in step with what the code and the docs (docs/development.md) read.

No Docker engine runs here, so the services are never started by the suite;
what can be checked without one is checked: loopback-only ports, health
checks, and that the DSNs the file and the docs tell people to export
reach those services with the credentials the file sets.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from aioelect import Elector, EtcdElector, MySQLElector, PostgresElector, RedisElector, from_env
from aioelect.core._config import parse_dsn

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "compose.yaml").read_text()
SERVICES: dict[str, Any] = yaml.safe_load(TEXT)["services"]
_DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")


def expand(value: str) -> str:
    """Compose's ``${VAR:-default}`` with every variable unset."""
    return _DEFAULT.sub(lambda m: m.group(2), value)


def exports(text: str) -> dict[str, str]:
    return dict(re.findall(r"^[ #]*export (AIOELECT_\w+)=(\S+)", text, re.MULTILINE))


def published(service: str) -> tuple[str, int]:
    (mapping,) = SERVICES[service]["ports"]
    host, port, _ = expand(mapping).split(":")
    return host, int(port)


def compose_client() -> list[str] | None:
    for argv in (["docker", "compose"], ["docker-compose"]):
        if (
            shutil.which(argv[0])
            and subprocess.run([*argv, "version"], capture_output=True, timeout=30).returncode == 0
        ):
            return argv
    return None


def test_services_versions_loopback_ports_and_health_checks() -> None:
    assert set(SERVICES) == {"mysql", "etcd", "postgres", "redis"}
    assert SERVICES["mysql"]["image"].startswith("mysql:8")
    assert re.search(r":v3\.5\.\d+$", SERVICES["etcd"]["image"])
    for name, service in SERVICES.items():
        for mapping in service["ports"]:
            assert expand(mapping).startswith("127.0.0.1:"), f"{name} publishes {mapping} beyond loopback"
        assert service["healthcheck"]["test"], f"{name} has no health check"
    client = compose_client()
    if client is not None:  # where a compose client exists, it must accept the file
        done = subprocess.run(
            [*client, "-f", str(ROOT / "compose.yaml"), "config", "-q"], capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr.decode()


def test_readme_and_compose_tell_the_same_exports() -> None:
    told = exports(TEXT)
    assert set(told) == {
        "AIOELECT_MYSQL_DSN",
        "AIOELECT_ETCD_ENDPOINTS",
        "AIOELECT_POSTGRES_DSN",
        "AIOELECT_REDIS_URL",
    }
    readme = (ROOT / "docs" / "development.md").read_text()
    section = readme.split("\n## Development servers (Docker)\n", 1)[1].split("\n## ", 1)[0]
    assert exports(section) == told


def test_exports_reach_the_services_with_their_credentials() -> None:
    told = exports(TEXT)
    for service, variable, scheme, user, password, database in (
        ("mysql", "AIOELECT_MYSQL_DSN", "mysql", "root", "MYSQL_ROOT_PASSWORD", "MYSQL_DATABASE"),
        ("postgres", "AIOELECT_POSTGRES_DSN", "postgresql", "postgres", "POSTGRES_PASSWORD", "POSTGRES_DB"),
    ):
        dsn = parse_dsn(told[variable], scheme)
        env = SERVICES[service]["environment"]
        assert (dsn.host, dsn.port) == published(service), variable
        assert (dsn.user, dsn.password, dsn.database) == (user, expand(env[password]), env[database]), variable
    redis = parse_dsn(told["AIOELECT_REDIS_URL"], "redis")
    assert (redis.host, redis.port) == published("redis")
    command = SERVICES["redis"]["command"]
    assert redis.password == expand(command[command.index("--requirepass") + 1])
    assert command[command.index("--appendfsync") + 1] == "always"  # tokens survive a crash
    host, port = published("etcd")
    assert told["AIOELECT_ETCD_ENDPOINTS"] == f"{host}:{port}"
    advertised = next(a for a in SERVICES["etcd"]["command"] if a.startswith("--advertise-client-urls="))
    assert expand(advertised).endswith(f"//{host}:{port}")


@pytest.mark.parametrize(
    ("variable", "kind"),
    [
        ("AIOELECT_MYSQL_DSN", MySQLElector),
        ("AIOELECT_ETCD_ENDPOINTS", EtcdElector),
        ("AIOELECT_POSTGRES_DSN", PostgresElector),
        ("AIOELECT_REDIS_URL", RedisElector),
    ],
)
async def test_from_env_builds_each_backend_from_the_exports(variable: str, kind: type[Elector]) -> None:
    elector = from_env({variable: exports(TEXT)[variable], "AIOELECT_NAME": "compose-check"})
    try:
        assert isinstance(elector, kind)
    finally:
        await elector.aclose()
