"""Throwaway Redis servers (``redis-server``) and Sentinels, on 127.0.0.1 with a temporary directory.

Never the machine's own Redis: each server has its own free port, directory
and configuration file, and listens on loopback only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from ..binaries import require_binary
from ..errors import ServerStartError
from ..lifecycle import OnePortServer, Started
from ..processes import LOOPBACK, free_port, run_bounded, track, untrack

__all__ = ["RedisCluster", "RedisServer", "SentinelServer", "redis_command"]


def _encode(*args: Any) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _read(f: Any) -> Any:
    line = f.readline()
    if not line:
        raise ConnectionError("the server closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = f.read(size + 2)
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        size = int(rest)
        return None if size < 0 else [_read(f) for _ in range(size)]
    raise RuntimeError(f"unexpected reply {line!r}")


def redis_command(
    port: int, *args: Any, host: str = LOOPBACK, password: str | None = None, user: str | None = None,
    timeout: float = 5.0, ca: str | None = None,
) -> Any:  # fmt: skip
    """Run one command on a new short connection (RESP2, bounded by ``timeout``; over TLS verified against ``ca``
    if given); an error reply raises RuntimeError."""
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout))
        if ca is not None:
            import ssl

            sock = stack.enter_context(ssl.create_default_context(cafile=ca).wrap_socket(sock, server_hostname=host))
        f = sock.makefile("rb")
        if password is not None:
            sock.sendall(_encode("AUTH", *((user,) if user else ()), password))
            _read(f)
        sock.sendall(_encode(*args))
        return _read(f)


class RedisServer(OnePortServer):
    """A throwaway ``redis-server`` on 127.0.0.1.

    ``appendfsync`` (default ``always``: every acknowledged write is on
    disk) with ``appendonly yes``; ``appendfsync=None`` runs without the
    append-only file (and without RDB snapshots), so a restart forgets
    everything. ``tls`` is a :class:`~tests.harness.certificates.Certificates`
    to serve TLS only, with client certificates optional. ``replica_of`` makes
    it a replica of that port. ``acl`` lines are written to the config file.
    """

    kind = "redis"

    def __init__(
        self,
        *,
        port: int | None = None,
        appendfsync: str | None = "always",
        tls: Any = None,
        replica_of: int | None = None,
        acl: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        self._redis = require_binary("redis-server")
        super().__init__(port=port, extra_args=extra_args, startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.appendfsync = appendfsync
        self.tls = tls
        self.replica_of = replica_of
        #: The master's address, for ``replica_of``.
        self.replica_host = LOOPBACK
        self.acl = list(acl)
        os.makedirs(self.data_dir, exist_ok=True)

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls is not None else "redis"
        query = f"?ssl_ca_certs={self.tls.ca}" if self.tls is not None else ""
        return f"{scheme}://{self.host}:{self._port}/0{query}"

    def _config(self) -> str:
        lines = [
            f"bind {self.host}",
            "protected-mode no",
            f"dir {self.data_dir}",
            'save ""',
            "daemonize no",
            f"appendonly {'yes' if self.appendfsync else 'no'}",
            f"appendfsync {self.appendfsync or 'everysec'}",
        ]
        if self.tls is not None:
            lines += [
                "port 0",
                f"tls-port {self._port}",
                f"tls-cert-file {self.tls.server_cert}",
                f"tls-key-file {self.tls.server_key}",
                f"tls-ca-cert-file {self.tls.ca}",
                "tls-auth-clients optional",
            ]
        else:
            lines.append(f"port {self._port}")
        if self.replica_of is not None:
            lines.append(f"replicaof {self.replica_host} {self.replica_of}")
        lines += [f"user {line}" for line in self.acl]
        return "\n".join(lines) + "\n"

    def _argv(self) -> list[str]:
        path = os.path.join(self._dir, "redis.conf")
        with open(path, "w") as fh:
            fh.write(self._config())
        return [self._redis, path, *self.extra_args]

    def _probe(self) -> bool:
        if self.tls is not None:
            import ssl

            context = ssl.create_default_context(cafile=self.tls.ca)
            with (
                socket.create_connection((self.host, self._port), timeout=2.0) as raw,
                context.wrap_socket(raw, server_hostname=self.host) as sock,
            ):
                sock.sendall(_encode("PING"))
                return bool(sock.recv(64).startswith(b"+PONG"))
        return bool(self.command("PING", timeout=2.0) == "PONG")

    def command(self, *args: Any, timeout: float = 5.0) -> Any:
        """Run one command as the default user (plaintext servers only)."""
        return redis_command(self._port, *args, host=self.host, timeout=timeout)


class SentinelServer(OnePortServer):
    """A throwaway ``redis-server --sentinel`` watching ``master`` (named ``master_name``) on 127.0.0.1."""

    kind = "sentinel"

    def __init__(
        self,
        master_port: int,
        *,
        master_name: str = "aioelect",
        quorum: int = 2,
        down_after_ms: int = 1000,
        tls: Any = None,
        password: str | None = None,
    ) -> None:
        self._redis = require_binary("redis-server")
        super().__init__(port=None, extra_args=(), startup_timeout=30.0, stop_timeout=10.0)
        self.master_port = master_port
        #: The master's address.
        self.master_host = LOOPBACK
        self.master_name = master_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        #: :class:`~tests.harness.certificates.Certificates`: TLS only, to clients and to the master (a TLS one).
        self.tls = tls
        #: ``requirepass`` of the Sentinel itself.
        self.password = password

    def _argv(self) -> list[str]:
        path = os.path.join(self._dir, "sentinel.conf")
        with open(path, "w") as fh:
            if self.tls is not None:
                fh.write(
                    f"port 0\ntls-port {self._port}\ntls-cert-file {self.tls.server_cert}\n"
                    f"tls-key-file {self.tls.server_key}\ntls-ca-cert-file {self.tls.ca}\n"
                    "tls-auth-clients optional\ntls-replication yes\n"
                )
            else:
                fh.write(f"port {self._port}\n")
            if self.password is not None:
                fh.write(f"requirepass {self.password}\n")
            fh.write(
                f"bind {self.host}\nprotected-mode no\ndir {self._dir}\n"
                f"sentinel monitor {self.master_name} {self.master_host} {self.master_port} {self.quorum}\n"
                f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.master_name} 5000\n"
                f"sentinel parallel-syncs {self.master_name} 1\n"
            )
        return [self._redis, path, "--sentinel"]

    def _probe(self) -> bool:
        return bool(self.command("PING", timeout=2.0) == "PONG")

    def command(self, *args: Any, timeout: float = 5.0) -> Any:
        ca = self.tls.ca if self.tls is not None else None
        return redis_command(self._port, *args, host=self.host, timeout=timeout, password=self.password, ca=ca)


class RedisCluster(Started):
    """A throwaway Redis Cluster of ``masters`` masters with ``replicas`` replicas each on 127.0.0.1, formed by
    ``redis-cli --cluster create``; ``start()`` returns once every node reports ``cluster_state:ok`` and every
    replica is in sync with its master.

    Each node is a :class:`RedisServer` (``appendonly yes``, ``appendfsync always``) with its cluster bus on a
    free port of its own (:meth:`bus_port`); each can be killed, stopped and started again individually, and
    :meth:`~RedisServer.place`-d in a network namespace of its own before :meth:`start`.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        tls: Any = None,
        node_timeout_ms: int = 2000,
        startup_timeout: float = 30.0,
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self._cli = require_binary("redis-cli")
        self.startup_timeout = startup_timeout
        self.replicas = replicas
        self._masters = masters
        self.tls = tls
        tls_args = ("--tls-cluster", "yes", "--tls-replication", "yes") if tls is not None else ()
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(masters * (1 + replicas)):
                self.nodes.append(
                    RedisServer(
                        extra_args=(
                            "--cluster-enabled", "yes",
                            "--cluster-port", str(free_port()),
                            "--cluster-node-timeout", str(node_timeout_ms),
                            "--repl-diskless-sync-delay", "0",  # a replica's first sync at once, not after 5 s
                            *tls_args,
                        ),
                        tls=tls,
                        startup_timeout=startup_timeout,
                    )
                )  # fmt: skip
        except BaseException:
            self.cleanup()
            raise
        track(self, self.cleanup)

    @property
    def url(self) -> str:
        """``redis+cluster://`` (``rediss+cluster://`` with TLS) listing every node."""
        nodes = ",".join(f"{n.host}:{n.port}" for n in self.nodes)
        if self.tls is not None:
            return f"rediss+cluster://{nodes}/?ssl_ca_certs={self.tls.ca}"
        return f"redis+cluster://{nodes}/"

    def command(self, node: RedisServer, *args: Any, timeout: float = 5.0) -> Any:
        """Run one command on ``node`` as the default user (over TLS on a TLS cluster)."""
        ca = self.tls.ca if self.tls is not None else None
        return redis_command(node.port, *args, host=node.host, timeout=timeout, ca=ca)

    @staticmethod
    def bus_port(node: RedisServer) -> int:
        """The port of ``node``'s cluster bus."""
        return int(node.extra_args[node.extra_args.index("--cluster-port") + 1])

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        log = os.path.join(self.nodes[0].directory, "cluster-create.log")
        argv = [self._cli, "--cluster", "create", *(f"{n.host}:{n.port}" for n in self.nodes)]
        if self.tls is not None:
            argv += ["--tls", "--cacert", self.tls.ca]
        run_bounded(
            [*argv, "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            log_path=log,
            timeout=30,
            what="cluster create",
        )
        self.wait_ok()

    def wait_ok(self, timeout: float | None = None) -> None:
        """Until every running node says ``cluster_state:ok`` and knows all nodes (ServerStartError after
        ``timeout``, default ``startup_timeout``)."""
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        while True:
            states = []
            for node in self.nodes:
                if node.running:
                    try:
                        states.append(str(self.command(node, "CLUSTER", "INFO", timeout=2.0)))
                    except (OSError, RuntimeError) as exc:
                        states.append(str(exc))
            if all("cluster_state:ok" in s and f"cluster_known_nodes:{len(self.nodes)}" in s for s in states):
                links = [str(self.command(n, "INFO", "replication", timeout=2.0)) for n in self.nodes if n.running]
                synced = sum("role:slave" in link and "master_link_status:up" in link for link in links)
                if synced >= self._masters * self.replicas - (len(self.nodes) - len(links)):
                    return
            if time.monotonic() > deadline:
                raise ServerStartError(f"the Redis Cluster did not form: {states}")
            time.sleep(0.1)

    def owner(self, key: str, asked: RedisServer | None = None) -> RedisServer:
        """The node that owns ``key``'s slot now (as ``asked`` sees it, by default the first running node)."""
        running = [n for n in self.nodes if n.running]
        slot = int(self.command(running[0], "CLUSTER", "KEYSLOT", key))
        for node in [asked] if asked is not None else running:
            for start, end, master, *_ in self.command(node, "CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return next(n for n in self.nodes if n.port == int(master[1]))
        raise LookupError(f"no node owns slot {slot}")

    def cleanup(self) -> None:
        untrack(self)
        for node in self.nodes:
            node.cleanup()
