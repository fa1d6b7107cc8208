"""A new user's first hour with the ``aioelect`` command: every library option reachable from the command line
and the environment, ``shards`` on every backend, and messages and log lines that name what to do.

Real processes against real servers; every process started is killed at teardown and every wait is bounded.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import aioelect
from aioelect.backends.etcd import EtcdOptions
from aioelect.backends.file import FileOptions
from aioelect.backends.local import LocalOptions
from aioelect.backends.redis import RedisOptions
from aioelect.backends.sql.mysql import MySQLOptions
from aioelect.backends.sql.postgres import PostgresOptions
from aioelect.cli._args import build_parser, split_command
from aioelect.cli._configure import configure
from aioelect.cli._status import UsageError
from aioelect.core import _backend as aioelect_backend
from aioelect.wiring import _settings

from .harness import EtcdServer, MariaDBServer, RedisServer, SentinelServer
from .test_cli import Spawner, cli, wait_until
from .test_cli_shards import _handover

pytestmark = pytest.mark.timeout(120)

#: Each backend's options, as the library takes them (the keyword arguments its elector validates).
OPTIONS: dict[str, Any] = {
    "etcd": EtcdOptions,
    "mysql": MySQLOptions,
    "postgres": PostgresOptions,
    "redis": RedisOptions,
    "file": FileOptions,
    "local": LocalOptions,
}

#: The flag of an option whose flag is not ``--option-name``.
FLAGS = {
    "ttl": "--ttl",
    "username": "--etcd-user",
    "password": "--password-file",
    "ca_file": "--etcd-ca",
    "cert_file": "--etcd-cert",
    "key_file": "--etcd-key",
    "fencing": "--no-fencing",  # on by default: the flag turns it off
    "volatile_tokens": "--allow-volatile-tokens",  # Redis's name of MySQL's allow_volatile_tokens
    "mode": "--file-mode",
}
#: The variable of an option whose variable is not ``AIOELECT_OPTION_NAME``.
VARIABLES = {
    "ttl": "AIOELECT_LEASE",  # etcd's word for lease
    "username": "AIOELECT_ETCD_USER",
    "ca_file": "AIOELECT_ETCD_CA",
    "cert_file": "AIOELECT_ETCD_CERT",
    "key_file": "AIOELECT_ETCD_KEY",
    "degrade_to_local": "AIOELECT_ETCD_DEGRADE_TO_LOCAL",
    "volatile_tokens": "AIOELECT_ALLOW_VOLATILE_TOKENS",
    "mode": "AIOELECT_FILE_MODE",
    "sentinel_username": "AIOELECT_REDIS_SENTINEL_USERNAME",
    "sentinel_password": "AIOELECT_REDIS_SENTINEL_PASSWORD",
}
_DSN_PART = "a part of the DSN (--mysql/--postgres, AIOELECT_MYSQL_DSN/AIOELECT_POSTGRES_DSN), which sets it"
_TLS = "a TLS context is a Python object: the DSN's TLS parameters (ssl-mode, sslmode...) set TLS"
#: Options deliberately not reachable from the command line, and why.
NOT_ON_THE_COMMAND_LINE = {
    **{(kind, part): _DSN_PART for kind in ("mysql", "postgres") for part in ("host", "port", "user", "database")},
    ("mysql", "ssl"): _TLS,
    ("postgres", "ssl"): _TLS,
    # A supervisor that led without etcd would run CMD on every instance at once.
    ("etcd", "degrade_to_local"): "the command never leads without etcd",
    # The command refuses the local backend (every instance would run CMD): none of its options apply.
    ("local", "name"): "the command refuses the local backend",
    # Read from the environment by the backend itself: a password on a command line is visible to every user.
    ("redis", "sentinel_username"): "the Sentinels' credentials come from the environment, with the URL",
    ("redis", "sentinel_password"): "a password on a command line is visible to every user of the host (ps)",
}
#: Options deliberately not reachable from the environment, and why.
NOT_IN_THE_ENVIRONMENT = {
    **{(kind, part): _DSN_PART for kind in ("mysql", "postgres") for part in ("host", "port", "user", "database")},
    ("mysql", "ssl"): _TLS,
    ("postgres", "ssl"): _TLS,
}


def _variables() -> set[str]:
    return {value for name, value in vars(_settings).items() if name.startswith("ENV_") and isinstance(value, str)}


def _flags() -> dict[str, set[str]]:
    parsers = build_parser()
    return {
        command: {flag for action in parser._actions for flag in action.option_strings}
        for command, parser in parsers.commands.items()
    }


def test_every_library_option_is_reachable_from_the_command_line_and_the_environment() -> None:
    flags, variables = _flags(), _variables()
    missing: list[str] = []
    for kind, spec in OPTIONS.items():
        for option in sorted(spec.__required_keys__ | spec.__optional_keys__):
            if (kind, option) not in NOT_ON_THE_COMMAND_LINE:
                flag = FLAGS.get(option, "--" + option.replace("_", "-"))
                for command in ("run", "shards", "leader", "observe"):
                    if flag not in flags[command]:
                        missing.append(f"{kind} {option}: no {flag} for `aioelect {command}`")
            if (kind, option) not in NOT_IN_THE_ENVIRONMENT:
                variable = VARIABLES.get(option, "AIOELECT_" + option.upper())
                if variable not in variables:
                    missing.append(f"{kind} {option}: no {variable}")
    assert not missing, "\n".join(missing)
    # Each variable is listed in --help's environment section.
    help_text = build_parser().main.format_help()
    unlisted = [v for v in variables if v not in help_text and v not in (_settings.ENV_TOKEN, _settings.ENV_SHARD)]
    assert not unlisted, unlisted


def _configured(argv: list[str], **environ: str) -> dict[str, Any]:
    ours, _ = split_command(argv)
    args = build_parser().main.parse_args(ours)
    return configure(args, _settings.Settings.from_environ(environ)).options


def test_the_redis_options_reach_the_elector_from_flags_and_variables() -> None:
    url = "redis://127.0.0.1:1/0"
    base = ["leader", "--redis", url, "--name", "n"]
    options = _configured([*base, "--min-replicas", "2", "--allow-volatile-tokens", "--key-prefix", "app:"])
    assert (options["min_replicas"], options["volatile_tokens"], options["key_prefix"]) == (2, True, "app:")
    env = {"AIOELECT_MIN_REPLICAS": "1", "AIOELECT_ALLOW_VOLATILE_TOKENS": "yes", "AIOELECT_KEY_PREFIX": "x:"}
    options = _configured(base, **env)
    assert (options["min_replicas"], options["volatile_tokens"], options["key_prefix"]) == (1, True, "x:")
    assert _configured([*base, "--min-replicas", "3"], **env)["min_replicas"] == 3  # a flag over its variable
    elector = aioelect.from_env({"AIOELECT_REDIS_URL": url, "AIOELECT_NAME": "n", **env})
    settings = elector._backend.settings  # type: ignore[attr-defined]
    assert (settings.min_replicas, settings.volatile_tokens, settings.key_prefix) == (1, True, "x:")
    # A flag that means nothing to the backend chosen is refused, naming it.
    with pytest.raises(UsageError, match="--min-replicas applies to the redis backend only"):
        _configured(["leader", "--file", "/tmp/x", "--min-replicas", "1"])


def test_the_other_backends_options_reach_their_electors() -> None:
    mysql = ["leader", "--mysql", "mysql://u@127.0.0.1:1/db", "--name", "n"]
    options = _configured([*mysql, "--allow-unsafe-topology", "--allow-volatile-tokens", "--connect-timeout", "3"])
    assert options["allow_unsafe_topology"] is options["allow_volatile_tokens"] is True
    assert options["connect_timeout"] == 3
    options = _configured(mysql, AIOELECT_FENCING="off", AIOELECT_CHECK_TIMEOUT="0.4", AIOELECT_CONNECT_TIMEOUT="2")
    assert (options["fencing"], options["check_timeout"], options["connect_timeout"]) == (False, 0.4, 2)
    postgres = ["leader", "--postgres", "postgresql://u@127.0.0.1:1/db", "--name", "n"]
    assert _configured([*postgres, "--schema", "elections"])["schema"] == "elections"
    assert _configured(postgres, AIOELECT_SCHEMA="s2")["schema"] == "s2"
    assert _configured(["leader", "--file", "/tmp/x", "--file-mode", "660"])["mode"] == 0o660
    assert _configured(["leader", "--file", "/tmp/x"], AIOELECT_FILE_MODE="0660")["mode"] == 0o660
    with pytest.raises(UsageError, match="--file-mode"):
        _configured(["leader", "--file", "/tmp/x", "--file-mode", "666"])
    elector = aioelect.from_env({"AIOELECT_FILE": "/tmp/x", "AIOELECT_FILE_MODE": "660"})
    assert elector._backend.mode == 0o660  # type: ignore[attr-defined]


@pytest.fixture
def volatile_redis() -> Iterator[RedisServer]:
    """A Redis as it is installed: without the append-only file."""
    with RedisServer(appendfsync=None) as server:
        yield server


def test_a_default_redis_is_refused_naming_the_flag_then_runs_with_it(volatile_redis: RedisServer) -> None:
    name = ["--redis", volatile_redis.url, "--name", f"v-{secrets.token_hex(3)}", "--timeout", "10"]
    refused = cli("run", *name, "--", sys.executable, "-c", "pass")
    assert refused.returncode == 3, refused.stderr
    assert "--allow-volatile-tokens" in refused.stderr and "AIOELECT_ALLOW_VOLATILE_TOKENS" in refused.stderr
    ran = cli("run", *name, "-q", "--allow-volatile-tokens", "--", sys.executable, "-c", "pass")
    assert ran.returncode == 0, ran.stderr
    assert "fencing tokens may repeat after a server crash" in ran.stderr, ran.stderr  # -q: a WARNING
    ran = cli("run", *name, "--", sys.executable, "-c", "pass", AIOELECT_ALLOW_VOLATILE_TOKENS="1")
    assert ran.returncode == 0, ran.stderr


# --- shards ------------------------------------------------------------------------------------------------------


@pytest.fixture
def spawner(tmp_path: Path) -> Iterator[Spawner]:
    s = Spawner(tmp_path)
    try:
        yield s
    finally:
        s.cleanup()


def test_shards_move_between_instances_on_redis(redis_url: str, spawner: Spawner, tmp_path: Path) -> None:
    started = time.monotonic()
    _handover(spawner, ["--redis", redis_url, "--lease", "3"], tmp_path)
    print(f"redis: {time.monotonic() - started:.1f}s")


def test_shards_move_between_instances_on_the_file_backend(spawner: Spawner, tmp_path: Path) -> None:
    started = time.monotonic()
    _handover(spawner, ["--file", str(tmp_path / "shards.lock")], tmp_path)
    print(f"file: {time.monotonic() - started:.1f}s")


# --- AIOELECT_BACKEND --------------------------------------------------------------------------------------------


def test_aioelect_backend_local_is_refused_saying_why_and_listed_in_help(tmp_path: Path) -> None:
    done = cli("leader", AIOELECT_BACKEND="local")
    assert done.returncode == 2, done.stderr
    assert "AIOELECT_BACKEND=local" in done.stderr and "every instance" in done.stderr, done.stderr
    done = cli("run", "--", "true", AIOELECT_BACKEND="memory")
    assert done.returncode == 2 and "AIOELECT_BACKEND=memory" in done.stderr, done.stderr
    # A backend on the command line replaces it, and says so.
    done = cli("leader", "-q", "--file", str(tmp_path / "lock"), AIOELECT_BACKEND="local")
    assert done.returncode == 1, done.stderr
    assert re.search(r"AIOELECT_BACKEND=local ignored: --file", done.stderr), done.stderr  # -q: a WARNING
    assert "AIOELECT_BACKEND" in cli("--help").stdout


# --- messages ----------------------------------------------------------------------------------------------------


def test_a_fractional_ttl_is_reported_as_the_flag() -> None:
    done = cli("leader", "--etcd", "127.0.0.1:9", "--name", "n", "--ttl", "2.5")
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]  # the usage above it names every flag
    assert "--ttl" in error and "whole number" in error, done.stderr


def test_a_master_name_the_sentinels_do_not_monitor_is_a_configuration_error() -> None:
    with RedisServer() as master, SentinelServer(master.port, quorum=1) as sentinel:
        url = f"redis+sentinel://127.0.0.1:{sentinel.port}/no-such-master/0"
        done = cli("leader", "--redis", url, "--name", "n", "--timeout", "10")
        assert done.returncode == 2, done.stderr
        error = done.stderr.strip().splitlines()[-1]
        assert "monitors a master named 'no-such-master'" in error and "they monitor: aioelect" in error, error
        assert "unreachable" not in done.stderr
        # The master it does monitor is reached.
        good = cli("leader", "--redis", url.replace("no-such-master", "aioelect"), "--name", "n", "--timeout", "10")
        assert good.returncode == 1, good.stderr


def test_a_wrong_mysql_password_says_the_login_was_refused(mariadb: MariaDBServer) -> None:
    secret = f"Pw-{secrets.token_hex(6)}!"
    mariadb.create_user("newcomer", secret)
    dsn = f"mysql://newcomer@127.0.0.1:{mariadb.port}/{mariadb.database}"
    done = cli("leader", "--mysql", dsn, "--name", "n", AIOELECT_PASSWORD=secret + "x")
    assert done.returncode == 3, done.stderr
    assert "refused the login" in done.stderr and "refused the query" not in done.stderr, done.stderr
    assert secret not in done.stderr


# --- log lines ---------------------------------------------------------------------------------------------------


async def test_the_file_backends_campaign_line_is_short(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aioelect")
    async with aioelect.FileElector(tmp_path / "lock") as elector:
        lead = await elector.acquire(timeout=10)
        await lead.release()
    lines = [r.getMessage() for r in caplog.records if "campaigning" in r.getMessage()]
    assert lines, caplog.text
    # Without the path (the user's choice): the rest of the line is short.
    shown = [line.replace(str(tmp_path / "lock"), "PATH") for line in lines]
    assert all(len(line) <= 160 for line in shown), shown


async def test_the_shared_session_warning_is_a_sentence_said_once(
    postgres_dsn: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="aioelect")
    # Said once per process: a test before this one in the same worker may have said it already.
    monkeypatch.setattr(aioelect_backend, "_FATE_SHARING_SAID", set())
    env = {"AIOELECT_POSTGRES_DSN": postgres_dsn, "AIOELECT_NAME": f"g-{secrets.token_hex(3)}"}
    shards = aioelect.Shards(["a", "b"], environ=env, settle=0.1)

    async def work(name: str) -> None:
        await anyio.sleep_forever()

    for _ in range(2):  # two runs: a shared session each
        with anyio.move_on_after(3):
            await shards.run(work)
    said = [r for r in caplog.records if "fate sharing" in r.getMessage()]
    assert said, caplog.text
    assert not any("EVERY" in r.getMessage() for r in said)
    assert all(r.levelno == logging.INFO for r in said), [(r.levelname, r.getMessage()) for r in said]
    assert len(said) == 1, [r.getMessage() for r in said]


async def test_renewal_recovered_is_logged_once_the_server_answers_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aioelect")
    with RedisServer() as server:
        options = {"lease": 10, "check_interval": 0.3, "check_timeout": 0.3, "renew_deadline": 7}
        async with aioelect.RedisElector(server.url, name=f"r-{secrets.token_hex(3)}", **options) as elector:
            lead = await elector.acquire(timeout=10)
            server.freeze()
            try:
                await asyncio.sleep(2.0)
            finally:
                server.thaw()
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    "renewal recovered", lambda: any("renewal recovered" in r.getMessage() for r in caplog.records), 6
                )
            )
            assert lead.held
            await lead.release()
    failed = [r for r in caplog.records if "renew failed" in r.getMessage()]
    recovered = [r for r in caplog.records if "renewal recovered" in r.getMessage()]
    assert failed and len(recovered) == 1, caplog.text
    assert recovered[0].levelno == logging.INFO
    match = re.search(r"renewal recovered after (\d+) failures? \(([\d.]+) s\)", recovered[0].getMessage())
    assert match and int(match.group(1)) == len(failed), recovered[0].getMessage()
    assert 1.0 <= float(match.group(2)) <= 6.0, recovered[0].getMessage()


async def test_renewal_recovered_is_logged_on_etcd_too(
    fresh_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The same line from the core keeper, fed by etcd's retried keep-alives."""
    caplog.set_level(logging.INFO, logger="aioelect")
    # ttl 12: a keep-alive every 4 s, each bounded by 2 s, a renew deadline of 8 s.
    async with aioelect.EtcdElector(fresh_etcd.endpoints, name=f"/r-{secrets.token_hex(3)}", ttl=12) as elector:
        lead = await elector.acquire(timeout=10)
        fresh_etcd.freeze()  # past the next keep-alive and its bound: at least one fails, and is retried
        try:
            await asyncio.sleep(6.5)
        finally:
            fresh_etcd.thaw()
        await anyio.to_thread.run_sync(
            lambda: wait_until(
                "renewal recovered", lambda: any("renewal recovered" in r.getMessage() for r in caplog.records), 8
            )
        )
        assert lead.held
        await lead.release()
    recovered = [r for r in caplog.records if "renewal recovered" in r.getMessage()]
    assert len(recovered) == 1 and recovered[0].levelno == logging.INFO, caplog.text
    assert re.search(r"renewal recovered after \d+ failures? \([\d.]+ s\)", recovered[0].getMessage())
