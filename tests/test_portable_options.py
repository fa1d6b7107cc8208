"""One timing vocabulary on every backend: the same code and the same variables run on a lock file and on a server.

Building an elector connects to nothing, so these tests need no server: they
read the timing each backend describes.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import aioelect
from aioelect.core._config import LockTiming
from aioelect.testing import MemoryElector
from aioelect.wiring import _factory


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
    from aioelect.cli._args import build_parser
    from aioelect.cli._configure import configure
    from aioelect.wiring._settings import Settings

    environ = {"AIOELECT_ETCD_ENDPOINTS": "127.0.0.1:2379", "AIOELECT_NAME": "portable/cli", "AIOELECT_LEASE": "4"}
    parser = build_parser().main
    from_variable = configure(parser.parse_args(["leader"]), Settings.from_environ(environ)).build()
    assert from_variable._backend.describe_timing().startswith("ttl=4s")
    from_flag = configure(parser.parse_args(["leader", "--ttl", "6"]), Settings.from_environ(environ)).build()
    assert from_flag._backend.describe_timing().startswith("ttl=6s")


def test_the_memory_backend_is_no_backend_of_the_command_line() -> None:
    from aioelect.wiring._settings import Settings

    assert Settings.from_environ({"AIOELECT_BACKEND": "memory", "AIOELECT_FILE": "/x/l.lock"}).backend() is None


def test_every_server_backend_keeps_one_typed_timing_whatever_the_lease_is_called() -> None:
    """``lease=`` (MySQL, PostgreSQL, Redis), etcd's ``ttl=``, or either through new(): one LockTiming, validated by
    one function, is what each backend reads its timing from."""
    timing = {"renew_deadline": 4, "connect_timeout": 3}
    electors = [
        aioelect.MySQLElector("mysql://app@127.0.0.1:3306/app", name="typed/timing", lease=6, **timing),
        aioelect.PostgresElector("postgresql://app@127.0.0.1:5432/app", name="typed/timing", lease=6, **timing),
        aioelect.RedisElector("redis://127.0.0.1:6379/0", name="typed/timing", lease=6, **timing),
        aioelect.EtcdElector("127.0.0.1:2379", name="typed/timing", ttl=6, **timing),
        aioelect.new(etcd="127.0.0.1:2379", name="typed/timing", lease=6, **timing),
        aioelect.new(mysql="mysql://app@127.0.0.1:3306/app", name="typed/timing", ttl=6, **timing),
    ]
    for elector in electors:
        kept = elector._backend.timing  # type: ignore[attr-defined]
        assert type(kept) is LockTiming, elector
        assert (kept.lease, kept.renew_deadline, kept.connect_timeout) == (6, 4, 3), elector
        assert elector._backend.renew_deadline == 4 and elector._backend.margin == 2, elector


def test_etcd_timing_is_refused_by_the_same_validation_as_the_others() -> None:
    """The same rule, the same words, only the lease's name differs; etcd's default deadline is a parameter."""
    refusals = []
    for build in (
        lambda: aioelect.MySQLElector("mysql://app@127.0.0.1:3306/app", name="typed/t", lease=6, renew_deadline=6),
        lambda: aioelect.EtcdElector("127.0.0.1:2379", name="typed/t", ttl=6, renew_deadline=6),
    ):
        with pytest.raises(ValueError) as refused:
            build()
        refusals.append(str(refused.value))
    assert refusals[0].replace("than lease", "than ttl") == refusals[1]
    assert "renew_deadline (6s) must be shorter than ttl (6s)" in refusals[1]
    # Defaults: 0.7 of the lease, and for etcd two of its three keep-alive intervals.
    mysql = aioelect.MySQLElector("mysql://app@127.0.0.1:3306/app", name="typed/t", lease=6)
    etcd = aioelect.EtcdElector("127.0.0.1:2379", name="typed/t", ttl=6)
    assert mysql._backend.timing.renew_deadline == pytest.approx(4.2)  # type: ignore[attr-defined]
    assert etcd._backend.timing.renew_deadline == 4.0  # type: ignore[attr-defined]
    assert etcd._backend.timing.check_interval == 2.0  # type: ignore[attr-defined]  # the keep-alive interval


def test_no_server_backend_reads_a_timing_option_by_its_name() -> None:
    """Only TimingRules.read reads the timing options by name; a backend reads its LockTiming's attributes.

    The file and memory backends are left out: they have no lease and no server, so no LockTiming describes them.
    """
    from aioelect import backends
    from aioelect.core._config import TIMING_OPTIONS

    names = "|".join((*TIMING_OPTIONS, "ttl"))
    by_name = re.compile(rf"""(\.get\(|\[)\s*["']({names})["']""")
    root = Path(backends.__file__).parent
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        if path.parent.name != "file" and path.name != "memory.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if by_name.search(line)
    ]
    assert found == []
