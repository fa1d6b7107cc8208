"""``aioelect shards``: one CMD per owned shard, each stopped before its shard is handed over.

The instances of a service run the same ``aioelect shards --names ... --
CMD``; :class:`aioelect.Shards` spreads the names over them and each
instance runs one CMD per name it owns, with ``AIOELECT_SHARD`` (the name),
``AIOELECT_TOKEN`` (that name's fencing token) and ``AIOELECT_IDENTITY`` in
its environment. Guarantees, on top of :mod:`aioelect.cli._supervisor`'s
(each CMD under its own shim, as ``aioelect run`` starts it):

* a CMD starts only while its name is owned, in that name's leader work;
* when the name moves (an instance joins or leaves) or its leadership is
  lost, CMD's whole tree gets SIGTERM, then SIGKILL after the grace, and the
  name is let go only once the tree is gone; the grace fits in the
  backend's safety margin (:func:`~aioelect.cli._run.choose_grace`);
* a CMD that exits is started again after ``--restart-delay`` while its
  name is still owned; processes it left running are stopped first;
* with ``--health-cmd`` or ``--health-url``, an instance takes part only
  once its check passes, and after ``--health-failures`` failures in a row
  hands every name over as on a stop signal (below), staying out for
  ``--health-backoff`` seconds and then until the check passes;
* each of :data:`~aioelect.cli._supervisor.STOP_SIGNALS` is forwarded to
  every CMD, and the instance drains
  (:meth:`aioelect.Shards.drain`): it leaves its member election and asks
  for no name again, each name is released once its CMD's tree is gone
  (the grace honoured), so the other instances take the names as they are
  released, never after a lease runs out; then aioelect exits with 128 +
  the signal.

On etcd every election of the instance shares one lease (an
:class:`~aioelect.EtcdSession`), on MySQL and PostgreSQL one connection (a
shared session): its names are lost together when it ends, and the
instance campaigns again for its share. On Redis and the file backend each
election has an elector of its own (a connection, a lock file beside the
one given), as :class:`~aioelect.Shards` builds them from the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from .._early import take
from .._shards import Shards
from ..core._elector import Elector, Leadership, current_leadership, default_identity, lock_descriptors
from ..core._errors import ElectionError
from ..core._errors import UsageError as NotRunning
from ..core._tasks import TaskSet
from ..wiring._settings import ENV_IDENTITY, ENV_SHARD, ENV_TOKEN
from ._configure import Config, first_contact
from ._orphans import reaper
from ._run import choose_grace, health_check
from ._start import start_cmd
from ._status import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, BackendError, UsageError
from ._supervisor import STOP_SIGNALS, ProcessGroup, child_environment, stop_timeout_for

__all__ = ["MAX_NAMES", "ShardsRunner", "parse_names"]

log = logging.getLogger("aioelect.cli")


#: The largest count ``--names`` takes: each name is an election of its own, built up front. (A list is
#: bounded by the kernel's limit on one argument, 128 KiB on Linux.)
MAX_NAMES = 100_000


def parse_names(text: str) -> list[str] | int:
    """``--names``: comma-separated names, or a count N (ASCII digits) for the names ``0`` to ``N-1``.

    A count above :data:`MAX_NAMES`, or written in other digits than 0-9, is
    a :class:`UsageError`, raised before any name is built.
    """
    text = text.strip()
    if text.isascii() and text.isdigit():
        digits = text.lstrip("0") or "0"
        if len(digits) > len(str(MAX_NAMES)) or int(digits) > MAX_NAMES:
            raise UsageError(f"--names {_shown(text)}: at most {MAX_NAMES} names")
        return int(digits)
    if text.isdigit():
        raise UsageError(f"--names {_shown(text)}: a count is written with the digits 0-9")
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UsageError(f"--names {_shown(text)}: an empty name (give NAME,NAME,... or a count)")
    return names


def _shown(text: str) -> str:
    """``text`` quoted for a message, cut to 40 characters."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "..."


def _shared_etcd(config: Config, identity: str) -> tuple[Any, Callable[[str], Elector]]:
    """One EtcdSession (one lease, one connection) for every election of this instance."""
    from ..backends.etcd import EtcdSession
    from ..wiring._electors import EtcdElector

    stop_timeout = config.options.get("stop_timeout", 5.0)
    # A shared session never degrades to leading without etcd: the option is the elector's alone.
    rest = {
        k: v for k, v in config.options.items() if k not in ("name", "identity", "stop_timeout", "degrade_to_local")
    }
    try:
        session = EtcdSession(config.target, **rest)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    return session, lambda name: EtcdElector(session=session, name=name, identity=identity, stop_timeout=stop_timeout)


class ShardsRunner:
    """Runs :class:`~aioelect.Shards` over ``--names`` with one CMD per owned name."""

    def __init__(
        self, config: Config, cmd: Sequence[str], args: argparse.Namespace, environ: Mapping[str, str]
    ) -> None:
        self.config = config
        self.cmd = list(cmd)
        self.environ = environ
        self.names = parse_names(args.names)
        self.pass_secrets: list[str] = list(args.pass_secret)
        self.restart_delay: float = args.restart_delay
        self.max_instances: int = args.max_instances
        self.given_grace: float | None = args.grace
        self.timeout: float = args.timeout
        self.health = health_check(args, environ)
        self.health_options = {
            "failures": args.health_failures,
            "interval": args.health_interval,
            "timeout": args.health_timeout,
            "backoff": args.health_backoff,
        }
        self.grace = 0.0
        self.identity: str = config.options.get("identity") or default_identity()
        group = config.options.get("name")
        if not group:
            raise UsageError("shards needs a group name: --name or AIOELECT_NAME (the prefix of its elections)")
        self.group_name: str = group
        #: CMD's process group per name, while it runs.
        self.running: dict[str, ProcessGroup] = {}
        self.signals: list[int] = []

    def on_signal(self, sig: int, stop: anyio.Event) -> None:
        """Forward ``sig`` to every CMD and drain: each name is let go once its CMD's tree is gone."""
        self.signals.append(sig)
        for name, group in self.running.items():
            if group.running:
                log.info("forwarding %s to CMD of %s (pid %d)", signal.Signals(sig).name, name, group.pid)
                group.signal(sig)
        stop.set()

    async def _drain_on(self, stop: anyio.Event, shards: Shards, scope: anyio.CancelScope) -> None:
        """Once a stop signal came: drain, then end the run."""
        await stop.wait()
        log.info("%s: draining: every name to the other instances, each once its CMD has stopped", self.identity)
        with contextlib.suppress(NotRunning):  # the run has not started: there is nothing to let go
            await shards.drain()
        scope.cancel()

    def _elector(self, election: str) -> Elector:
        """One elector of its own for ``election`` (Redis, the file backend: no shared session there)."""
        c = self.config
        target = c.target
        if c.kind == "file":
            # A lock file holds one election: each gets its own file beside the one given, as Shards does.
            target = f"{c.target}.{urllib.parse.quote(election, safe='')}"
        return Config(c.kind, target, c.where, {**c.options, "name": election, "identity": self.identity}).build()

    def _shards(self, session_out: list[Any]) -> Shards:
        kind = self.config.kind
        if kind in ("redis", "file"):
            return Shards(
                self.names,
                group=self.group_name,
                electors=self._elector,
                identity=self.identity,
                max_instances=self.max_instances,
            )
        if kind == "etcd":
            session, electors = _shared_etcd(self.config, self.identity)
            session_out.append(session)
            return Shards(
                self.names,
                group=self.group_name,
                electors=electors,
                identity=self.identity,
                max_instances=self.max_instances,
            )
        # MySQL and PostgreSQL: Shards opens one shared session per run.
        options = {k: v for k, v in self.config.options.items() if k not in ("name", "identity")}
        return Shards(
            self.names,
            group=self.group_name,
            identity=self.identity,
            max_instances=self.max_instances,
            environ={},
            **{kind: self.config.target, **options},
        )

    async def main(self) -> int:
        """Take part until a stop signal; return 128 + the signal, or raise BackendError on a permanent error."""
        session_out: list[Any] = []
        # Not on the group's own name: on etcd the group's elections are under it (``group/shard/...``).
        where = self.config
        probe = Config(
            where.kind, where.target, where.where, {**where.options, "name": f"{self.group_name}/probe"}
        ).build()
        try:
            self.grace = choose_grace(self.given_grace, probe, self.config.kind)
            # A grace chosen from the margin may outlast the stop_timeout built from --grace as given: every
            # name's elector waits for its CMD as long as the grace and the kill take before it lets go.
            needed = stop_timeout_for(self.grace)
            if self.config.options.get("stop_timeout", 0.0) < needed:
                self.config.options["stop_timeout"] = needed
            try:
                shards = self._shards(session_out)
            except (TypeError, ValueError) as exc:
                raise UsageError(str(exc)) from None
            if self.health is not None:
                shards.set_health(self.health, **self.health_options)
            # Fail fast (status 3) on a server that cannot be reached at all; later outages are retried.
            await first_contact(probe, self.config, self.timeout)
        finally:
            with anyio.CancelScope(shield=True):
                await probe.aclose()
        loop = asyncio.get_running_loop()
        reaping = reaper()
        stop = anyio.Event()
        with anyio.CancelScope() as scope:
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self.on_signal, sig, stop)
            for sig in take(STOP_SIGNALS):  # received while the command was starting
                self.on_signal(sig, stop)
            # A task of its own, not a task group: run()'s errors reach the handler below as themselves.
            drainer = TaskSet()
            drainer.start(self._drain_on(stop, shards, scope), name=f"aioelect shards drain {self.group_name}")
            try:
                if session_out:
                    async with session_out[0]:
                        await shards.run(self._work)
                else:
                    await shards.run(self._work)
            except ElectionError as exc:
                raise BackendError(str(exc)) from None
            finally:
                await drainer.aclose()
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)
                with anyio.CancelScope(shield=True):
                    await reaping.aclose()
        return 128 + self.signals[0] if self.signals else 0

    async def _work(self, name: str) -> None:
        """CMD for ``name`` while it is owned: started again after it exits, stopped before the name goes."""
        lead = current_leadership()
        while True:
            status = await self._run_once(name, lead)
            if status is None:
                await anyio.sleep_forever()  # CMD cannot be run: hold the name, run nothing (logged)
            log.info("CMD of %s exited with status %d; starting it again in %gs", name, status, self.restart_delay)
            await anyio.sleep(self.restart_delay)

    async def _run_once(self, name: str, lead: Leadership) -> int | None:
        token = "" if lead.token is None else str(lead.token)
        env = child_environment(
            self.environ,
            pass_secrets=self.pass_secrets,
            extra={ENV_IDENTITY: lead.identity, ENV_TOKEN: token, ENV_SHARD: name},
        )
        try:
            # The shim keeps the lock's descriptors: the lock cannot pass on before CMD's tree is gone.
            group = await start_cmd(self.cmd, env, hold=lock_descriptors(lead))
        except FileNotFoundError:
            log.error("CMD not found: %s (exit status %d)", self.cmd[0], EXIT_NOT_FOUND)
            return None
        except OSError as exc:
            log.error("CMD cannot be executed: %s (%s; exit status %d)", self.cmd[0], exc.strerror, EXIT_NOT_EXECUTABLE)
            return None
        self.running[name] = group
        log.info(
            "owner of %s (token %s): started %s, pid %d", name, lead.token, os.path.basename(self.cmd[0]), group.pid
        )
        try:
            await asyncio.shield(group.exited)
        finally:
            # Cancelled (the name moves, its leadership is lost, aioelect stops) or CMD exited: nothing of its
            # tree may outlive this, and the name is let go only after.
            with anyio.CancelScope(shield=True):
                try:
                    if group.running or group.alive():
                        if lead.lost:
                            log.warning(
                                "leadership of %s lost (%s): stopping CMD (pid %d) and every process it started",
                                name,
                                lead.lost_reason,
                                group.pid,
                            )
                        await group.terminate(self.grace)
                finally:
                    await group.aclose()
                    del self.running[name]
        return await group.status()
