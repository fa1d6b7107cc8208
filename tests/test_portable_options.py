"""One timing vocabulary on every backend: the same code and the same variables run on a lock file and on a server.

Building an elector connects to nothing, so these tests need no server: they
read the timing each backend describes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import aioelect
from aioelect import _factory
from aioelect.testing import MemoryElector


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the once-per-process warnings afresh."""
    monkeypatch.setattr(_factory, "_IGNORED_SAID", set())


@pytest.fixture
def lock_file(tmp_path: Path) -> str:
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    return str(directory / "leader.lock")


def ignored(caplog: pytest.LogCaptureFixture) -> list[str]:
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    return [message for message in warnings if "means nothing" in message]


def test_a_lease_on_the_file_backend_is_said_once_at_warning_never_a_crash(
    lock_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    environ = {"AIOELECT_FILE": lock_file}
    assert isinstance(aioelect.from_env(environ, lease=3), aioelect.FileElector)
    assert isinstance(aioelect.from_env(environ, lease=3, renew_deadline=2), aioelect.FileElector)
    said = ignored(caplog)
    assert len(said) == 2 and said[0].startswith("lease=3 means nothing to the file backend"), said
    assert said[1].startswith("renew_deadline=2 means nothing to the file backend"), said


def test_a_typo_is_still_a_type_error(lock_file: str) -> None:
    with pytest.raises(TypeError, match="leese"):
        aioelect.from_env({"AIOELECT_FILE": lock_file}, leese=3)


def test_the_timing_variables_reach_every_backend() -> None:
    timing = {"AIOELECT_NAME": "portable/timing", "AIOELECT_LEASE": "6", "AIOELECT_RENEW_DEADLINE": "4"}
    mysql = aioelect.from_env({**timing, "AIOELECT_MYSQL_DSN": "mysql://app@127.0.0.1:3306/app"})
    postgres = aioelect.from_env({**timing, "AIOELECT_POSTGRES_DSN": "postgresql://app@127.0.0.1:5432/app"})
    etcd = aioelect.from_env({**timing, "AIOELECT_ETCD_ENDPOINTS": "127.0.0.1:2379", "AIOELECT_RENEW_DEADLINE": ""})
    for elector in (mysql, postgres):
        assert "renew_deadline=4s lease=6s" in elector._backend.describe_timing()
    assert etcd._backend.describe_timing().startswith("ttl=6s")


def test_ttl_is_the_same_option_as_lease() -> None:
    mysql = aioelect.new(mysql="mysql://app@127.0.0.1:3306/app", name="portable/ttl", ttl=7)
    assert "lease=7s" in mysql._backend.describe_timing()
    etcd = aioelect.new(etcd="127.0.0.1:2379", name="portable/ttl", lease=4)
    assert etcd._backend.describe_timing().startswith("ttl=4s")
    with pytest.raises(ValueError, match="whole"):  # etcd's own word keeps etcd's own rule
        aioelect.new(etcd="127.0.0.1:2379", name="portable/ttl", ttl=2.5)
    with pytest.raises(ValueError, match="ttl is etcd's word for lease"):
        aioelect.new(etcd="127.0.0.1:2379", name="portable/ttl", lease=4, ttl=5)


def test_a_lease_in_whole_seconds_is_rounded_up_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    etcd = aioelect.new(etcd="127.0.0.1:2379", name="portable/round", lease=2.5)
    assert etcd._backend.describe_timing().startswith("ttl=3s")
    assert any("lease=2.5 rounded up to 3 s" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize(
    ("variable", "value"), [("AIOELECT_LEASE", "ten"), ("AIOELECT_POLL_INTERVAL", "-1"), ("AIOELECT_LEASE", "inf")]
)
def test_a_timing_variable_that_is_not_seconds_is_refused_by_name(variable: str, value: str, lock_file: str) -> None:
    with pytest.raises(ValueError, match=variable):
        aioelect.from_env({"AIOELECT_FILE": lock_file, variable: value})


async def test_the_memory_backend_from_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"AIOELECT_BACKEND": "memory", "AIOELECT_NAME": "portable/memory", "AIOELECT_LEASE": "5"}
    async with aioelect.from_env(environ) as first, aioelect.from_env(environ) as second:
        assert isinstance(first, MemoryElector) and first.name == "portable/memory"
        async with aioelect.leadership(first) as lead:
            assert lead.token == 1
            assert await second.try_acquire() is None  # one election for both, as on a server
    assert any("memory backend chosen" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert ignored(caplog) == [
        "lease=5.0 means nothing to the memory backend, ignored: an in-memory election has no lease, polls nothing "
        "and has no server"
    ]


def test_the_command_line_reads_the_timing_variables_under_its_flags() -> None:
    from aioelect._settings import Settings
    from aioelect.cli._args import build_parser
    from aioelect.cli._configure import configure

    environ = {"AIOELECT_ETCD_ENDPOINTS": "127.0.0.1:2379", "AIOELECT_NAME": "portable/cli", "AIOELECT_LEASE": "4"}
    parser = build_parser().main
    from_variable = configure(parser.parse_args(["leader"]), Settings.from_environ(environ)).build()
    assert from_variable._backend.describe_timing().startswith("ttl=4s")
    from_flag = configure(parser.parse_args(["leader", "--ttl", "6"]), Settings.from_environ(environ)).build()
    assert from_flag._backend.describe_timing().startswith("ttl=6s")


def test_the_memory_backend_is_no_backend_of_the_command_line() -> None:
    from aioelect._settings import Settings

    assert Settings.from_environ({"AIOELECT_BACKEND": "memory", "AIOELECT_FILE": "/x/l.lock"}).backend() is None
