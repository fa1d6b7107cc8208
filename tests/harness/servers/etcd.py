"""Throwaway etcd: one member (:class:`EtcdServer`) or a cluster of them (:class:`EtcdCluster`).

The ``etcd`` and ``etcdctl`` executables are the ones
:func:`~tests.harness.binaries.require_binary` finds, so one run tests one
etcd version end to end; :func:`started_etcd_versions` says which ran.
Readiness is judged on the plain-HTTP metrics listener's ``/health``, so TLS
client listeners work too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from ..binaries import etcd_tool_version, require_binary
from ..errors import HarnessError
from ..lifecycle import ManagedServer, Started
from ..processes import LOOPBACK, free_port, track, untrack

__all__ = ["EtcdCluster", "EtcdServer", "started_etcd_versions"]

log = logging.getLogger("tests.harness")


def _http_json(url: str, timeout: float, body: bytes | None = None) -> Any:
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


_started_etcd: dict[str, str] = {}
_started_etcd_lock = threading.Lock()


def started_etcd_versions() -> dict[str, str]:
    """``{path: version}`` of every ``etcd`` executable an :class:`EtcdServer` of this process started."""
    with _started_etcd_lock:
        return dict(_started_etcd)


class EtcdServer(ManagedServer):
    """A throwaway etcd member (v3 API only) on 127.0.0.1.

    The ``etcd`` executable is the one :func:`require_binary` finds (see
    ``AIOELECT_TEST_ETCD_DIR`` and ``AIOELECT_TEST_ETCD_VERSION`` there);
    :attr:`binary_version` is what it reports, logged at INFO on every start,
    and :meth:`server_version` is what the running member reports.

    By default a single-member cluster.  ``initial_cluster`` / ``name`` /
    ports are set by :class:`EtcdCluster` to make it one member of many.
    ``extra_args`` are appended to the etcd command line (e.g. TLS flags; use
    ``client_scheme="https"`` with TLS client listeners).  Readiness is
    checked on the plain-HTTP metrics listener's ``/health`` (which requires
    a raft leader), so it works with TLS client listeners too.
    """

    kind = "etcd"

    def __init__(
        self,
        *,
        name: str = "aioelect",
        client_port: int | None = None,
        peer_port: int | None = None,
        metrics_port: int | None = None,
        initial_cluster: str | None = None,
        cluster_token: str | None = None,
        client_scheme: str = "http",
        snapshot_count: int = 1000,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        self._etcd = require_binary("etcd")
        self.binary_version = etcd_tool_version(self._etcd, "etcd")
        super().__init__(extra_args=extra_args, startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.name = name
        self._auto_ports = client_port is None and peer_port is None and initial_cluster is None
        self._client_port = client_port if client_port is not None else free_port()
        self._peer_port = peer_port if peer_port is not None else free_port()
        self._metrics_port = metrics_port if metrics_port is not None else free_port()
        self._initial_cluster = initial_cluster
        self.cluster_token = cluster_token or f"aioelect-{secrets.token_hex(6)}"
        self.client_scheme = client_scheme
        self.snapshot_count = snapshot_count

    @property
    def binary(self) -> str:
        """Absolute path of the ``etcd`` executable this member runs."""
        return self._etcd

    @property
    def port(self) -> int:
        """Client port."""
        return self._client_port

    @property
    def peer_port(self) -> int:
        return self._peer_port

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` of the client listener."""
        return f"{self.host}:{self._client_port}"

    @property
    def endpoints(self) -> list[str]:
        """``[endpoint]`` (same shape as :attr:`EtcdCluster.endpoints`)."""
        return [self.endpoint]

    @property
    def client_url(self) -> str:
        return f"{self.client_scheme}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self._peer_port}"

    @property
    def metrics_url(self) -> str:
        """``http://127.0.0.1:M/metrics`` (Prometheus text format)."""
        return f"http://{self.host}:{self._metrics_port}/metrics"

    @property
    def health_url(self) -> str:
        return f"http://{self.host}:{self._metrics_port}/health"

    def _reassign_ports(self) -> bool:
        if self._initial_cluster is not None:
            return False
        self._client_port, self._peer_port, self._metrics_port = free_port(), free_port(), free_port()
        return True

    def _argv(self) -> list[str]:
        initial_cluster = self._initial_cluster or f"{self.name}={self.peer_url}"
        return [
            self._etcd,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={initial_cluster}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self.cluster_token}",
            f"--listen-metrics-urls=http://{self.host}:{self._metrics_port}",
            "--enable-v2=false",
            f"--snapshot-count={self.snapshot_count}",
            "--logger=zap",
            "--log-outputs=stderr",
            *self.extra_args,
        ]

    def _spawn(self) -> None:
        super()._spawn()
        with _started_etcd_lock:
            _started_etcd[self._etcd] = self.binary_version
        log.info("starting etcd %s (%s) as %s on %s", self.binary_version, self._etcd, self.name, self.client_url)

    def _probe(self) -> bool:
        return self.healthy(timeout=1.0)

    def server_version(self, timeout: float = 2.0) -> str:
        """The version the running member reports (``etcd_server_version`` on its metrics listener)."""
        url = self.metrics_url
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
        match = re.search(r'^etcd_server_version\{server_version="([^"]+)"\} 1', text, re.M)
        if match is None:
            raise HarnessError(f"{url} has no etcd_server_version metric")
        return match.group(1)

    def healthy(self, timeout: float = 2.0) -> bool:
        """True if the member's ``/health`` reports healthy (it sees a leader)."""
        try:
            data = _http_json(self.health_url, timeout)
        except (OSError, ValueError):
            return False
        return str(data.get("health")).lower() == "true"

    def status(self, timeout: float = 2.0) -> dict[str, Any]:
        """``Maintenance.Status`` of this member via the JSON gateway (HTTP client URL only)."""
        data = _http_json(f"{self.client_url}/v3/maintenance/status", timeout, body=b"{}")
        assert isinstance(data, dict)
        return data

    def etcdctl(self, *args: str, timeout: float = 10.0, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``etcdctl --endpoints=<this member> ARGS`` with ``ETCDCTL_API=3``.

        The command is bounded by ``timeout`` (also passed as etcdctl's
        ``--command-timeout``); on expiry ``subprocess.TimeoutExpired`` is
        raised.  ``check=True`` raises ``CalledProcessError`` on failure.
        """
        return _etcdctl(self.endpoints, args, timeout=timeout, check=check)


def _etcdctl(
    endpoints: Sequence[str], args: Sequence[str], *, timeout: float, check: bool
) -> subprocess.CompletedProcess[str]:
    binary = require_binary("etcdctl")
    env = dict(os.environ, ETCDCTL_API="3")
    argv = [
        binary,
        f"--endpoints={','.join(endpoints)}",
        "--dial-timeout=2s",
        f"--command-timeout={max(timeout - 0.5, 0.5):.1f}s",
        *args,
    ]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=check)


class EtcdCluster(Started):
    """A throwaway multi-member etcd cluster (default three members) on 127.0.0.1.

    ``members`` are :class:`EtcdServer` objects sharing one
    ``--initial-cluster``; each can be killed, frozen, stopped and started
    again individually (it rejoins with its data).  ``start()`` returns once
    every member reports healthy.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        require_binary("etcd")
        token = f"aioelect-cluster-{secrets.token_hex(6)}"
        names = [f"aioelect-{i}" for i in range(size)]
        peer_ports = [free_port() for _ in names]
        initial = ",".join(f"{n}=http://{LOOPBACK}:{p}" for n, p in zip(names, peer_ports, strict=True))
        self.startup_timeout = startup_timeout
        self._cleaned = False
        self.members: list[EtcdServer] = []
        try:
            for name, peer_port in zip(names, peer_ports, strict=True):
                self.members.append(
                    EtcdServer(
                        name=name,
                        client_port=free_port(),
                        peer_port=peer_port,
                        initial_cluster=initial,
                        cluster_token=token,
                        extra_args=extra_args,
                        startup_timeout=startup_timeout,
                        stop_timeout=stop_timeout,
                    )
                )
        except BaseException:
            for member in self.members:
                member.cleanup()
            raise
        track(self, self.cleanup)

    @property
    def endpoints(self) -> list[str]:
        """Client endpoints (``127.0.0.1:PORT``) of all members, live or not."""
        return [m.endpoint for m in self.members]

    def start(self) -> None:
        """Start every member that is not running; wait until all are healthy (bounded)."""
        starting = [m for m in self.members if not m.running]
        for member in starting:
            member._spawn()
        deadline = time.monotonic() + self.startup_timeout
        try:
            for member in starting:
                member._wait_ready(deadline)
                member._ever_ready = True
        except BaseException:
            for member in starting:
                member.kill()
            raise

    def stop(self) -> None:
        """Gracefully stop every member."""
        for member in self.members:
            member.stop()

    def kill(self) -> None:
        """SIGKILL every member."""
        for member in self.members:
            member.kill()

    def leader(self, timeout: float = 5.0) -> EtcdServer | None:
        """The member that currently leads, or None if none is known within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for member in self.members:
                if not member.running or member.frozen:
                    continue
                try:
                    status = member.status(timeout=1.0)
                except (OSError, ValueError):
                    continue
                leader_id = str(status.get("leader", ""))
                if leader_id and leader_id != "0" and leader_id == str(status["header"].get("member_id")):
                    return member
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def etcdctl(self, *args: str, timeout: float = 10.0, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``etcdctl`` against all member endpoints (see :meth:`EtcdServer.etcdctl`)."""
        return _etcdctl(self.endpoints, args, timeout=timeout, check=check)

    def cleanup(self) -> None:
        """Kill every member and delete all data directories.  Idempotent."""
        if self._cleaned:
            return
        for member in self.members:
            member.kill()
        for member in self.members:
            member.cleanup()
        self._cleaned = True
        untrack(self)
