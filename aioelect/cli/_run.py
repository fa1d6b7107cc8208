"""``aioelect run``: campaign, run CMD only while leader, and stop it before the leadership can pass on.

Guarantees, on top of :mod:`aioelect.cli._supervisor`'s:

* CMD starts only while this process holds the leadership, in the task
  the leadership is bound to;
* on a loss every process of CMD's tree (its process group and, on Linux,
  every descendant, wherever it went) gets SIGTERM, then SIGKILL after the
  grace, and the lock is released only once they are gone; the grace fits
  in the backend's safety margin (:func:`choose_grace`), so CMD is dead
  before another candidate can lead;
* when CMD exits, processes it left running are stopped the same way
  before the release;
* each of :data:`~aioelect.cli._supervisor.STOP_SIGNALS` (INT, TERM, HUP,
  QUIT, USR1, USR2) is forwarded to CMD's group and ends aioelect once CMD
  has exited (no restart with ``--forever``), or stops the campaign before
  CMD started; SIGPIPE is ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shlex
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import anyio

from .._requests import serve_step_downs
from ..core._elector import Elector, Leadership, lock_descriptors
from ..core._tasks import first_of
from ..wiring._settings import ENV_HEALTH_URL, ENV_IDENTITY, ENV_TOKEN
from ._start import start_cmd
from ._status import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_NOT_LEADER, UsageError
from ._supervisor import DEFAULT_GRACE, KILL_RESERVE, ProcessGroup, child_environment

if TYPE_CHECKING:
    from .._http import BoundedHTTPServer
    from ..integrations.health import HealthServer

__all__ = [
    "Runner",
    "check_metrics",
    "choose_grace",
    "health_check",
    "serve_health",
    "serve_metrics",
]

log = logging.getLogger("aioelect.cli")


def _safety_margin(elector: Elector) -> tuple[float, float, float] | None:
    """``(margin, lease, renew_deadline)``: how long before a cut-off leader's lock can pass on it knows of
    its loss; None for a backend whose leadership cannot be taken away while this process lives."""
    return elector.lock_timing()


def choose_grace(given: float | None, elector: Elector, kind: str) -> float:
    """The grace CMD gets after a loss: ``given`` if it fits in the safety margin (else UsageError)."""
    found = _safety_margin(elector)
    if found is None:
        return DEFAULT_GRACE if given is None else given
    margin, lease, deadline = found
    limit = max(0.0, margin - KILL_RESERVE)
    if given is not None and given > limit:
        longer = "--ttl" if kind == "etcd" else "--lease"
        raise UsageError(
            f"--grace {given:g} is too long for the {kind} backend: CMD must be dead before the lock can pass to "
            f"another candidate, and a cut-off leader learns of its loss only {margin:.3g}s before that (the "
            f"safety margin: lease {lease:g}s less renew deadline {deadline:.3g}s), {KILL_RESERVE:g}s of which "
            f"are kept for SIGKILL; give --grace {limit:.3g} or less, a longer {longer} or a shorter --renew-deadline"
        )
    if limit == 0:
        log.warning(
            "the %s backend's safety margin (%.3gs) leaves no time for SIGTERM: after a loss CMD gets SIGKILL at "
            "once, and may still run briefly after the lock can pass on; use a longer %s or a shorter --renew-deadline",
            kind,
            margin,
            "--ttl" if kind == "etcd" else "--lease",
        )
    return min(margin / 2, limit) if given is None else given


def check_metrics(args: argparse.Namespace) -> None:
    """Fail before campaigning if --metrics-port cannot work (the extra is missing)."""
    if getattr(args, "metrics_port", None) is None:
        return
    try:
        import aioelect.metrics  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"--metrics-port: {exc}") from None


async def serve_metrics(elector: Elector, host: str, port: int) -> BoundedHTTPServer:
    """Serve ``elector``'s metrics on ``http://host:port/metrics`` in this event loop (the caller closes it).

    The server is the health probes' bounded one (a connection cap, request
    timeouts, rate-limited accept errors), not prometheus_client's thread per
    connection: idle clients cannot pile up threads or descriptors.
    """
    import prometheus_client

    from .._http import BoundedHTTPServer
    from ..metrics import PrometheusMetrics

    # A registry of our own (main() may run more than once in a process), with the usual process metrics.
    registry = prometheus_client.CollectorRegistry()
    for collector in (prometheus_client.ProcessCollector, prometheus_client.PlatformCollector):
        collector(registry=registry)
    prometheus_client.GCCollector(registry=registry)
    metrics = PrometheusMetrics(registry)
    metrics.attach(elector)
    server = BoundedHTTPServer(metrics.respond, name="metrics")
    try:
        await server.start(host, port)
    except OSError as exc:
        await server.aclose()
        raise UsageError(f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    log.info("metrics on http://%s:%d/metrics", host if ":" not in host else f"[{host}]", port)
    return server


async def serve_health(elector: Elector, host: str, port: int) -> HealthServer:
    """Serve the Kubernetes probes of ``elector`` on ``host:port`` in this event loop (the caller closes it)."""
    from ..integrations.health import HealthServer

    health = HealthServer(elector)
    try:
        await health.start(host, port)
    except OSError as exc:
        await health.aclose()
        raise UsageError(f"--health-port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    where = host if ":" not in host else f"[{host}]"
    log.info("probes on http://%s:%d/healthz, /readyz and /leader", where, port)
    return health


def command_check(command: str, environ: Mapping[str, str]) -> Callable[[], Awaitable[bool]]:
    """A health check that runs ``command`` (split as a shell would) and passes if it exits 0.

    A check cancelled (its timeout) kills the command and reaps it before it returns: none outlives its check.
    """
    argv = shlex.split(command)
    if not argv:
        raise UsageError("--health-cmd is empty")

    async def check() -> bool:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, env=dict(environ)
        )
        try:
            return await proc.wait() == 0
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with anyio.CancelScope(shield=True):
                    await proc.wait()

    return check


def health_check(args: argparse.Namespace, environ: Mapping[str, str]) -> Callable[[], Awaitable[bool]] | None:
    """The health check ``--health-cmd`` and ``--health-url`` ask for (both: each must pass); None without them."""
    from ._health_url import combined_check, parse_health_url

    checks: list[Callable[[], Awaitable[object]]] = []
    if args.health_cmd is not None:
        checks.append(
            command_check(args.health_cmd, child_environment(environ, pass_secrets=args.pass_secret, extra={}))
        )
    url = args.health_url if args.health_url is not None else environ.get(ENV_HEALTH_URL) or None
    if url is not None:
        checks.append(parse_health_url(url).check)
    return combined_check(checks) if checks else None


class Runner:
    """``aioelect run``: one leadership (or one after another) and CMD under it."""

    def __init__(
        self, elector: Elector, cmd: Sequence[str], args: argparse.Namespace, environ: Mapping[str, str]
    ) -> None:
        self.elector = elector
        self.cmd = list(cmd)
        #: The environment CMD's is made from (aioelect's secrets are taken out).
        self.environ = environ
        self.grace: float = args.grace if args.grace is not None else DEFAULT_GRACE
        self.pass_secrets: list[str] = list(args.pass_secret)
        self.forever: bool = args.forever
        self.serve_step_down: bool = getattr(args, "serve_step_down", False)
        self.no_wait: bool = getattr(args, "no_wait", False)
        if self.no_wait and self.forever:
            raise UsageError("--no-wait and --forever exclude each other: --no-wait runs CMD at most once")
        conflict: int | None = getattr(args, "conflict_exit_code", None)
        if conflict is not None and not self.no_wait:
            raise UsageError("--conflict-exit-code applies to --no-wait only: without it aioelect waits to lead")
        #: The exit status when another instance leads under --no-wait.
        self.conflict_status = EXIT_NOT_LEADER if conflict is None else conflict
        self.restart_delay: float = args.restart_delay
        self.group: ProcessGroup | None = None
        self.signals: list[int] = []
        self.stopping = asyncio.Event()
        self._campaign_scope: anyio.CancelScope | None = None

    def on_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.stopping.set()
        if self._campaign_scope is not None:
            self._campaign_scope.cancel()
        if self.group is not None and self.group.running:
            log.info("forwarding %s to CMD (pid %d)", signal.Signals(sig).name, self.group.pid)
            self.group.signal(sig)

    def _stopped_status(self) -> int:
        return 128 + self.signals[0]

    async def main(self) -> int:
        while True:
            if self.no_wait:
                if self.stopping.is_set():
                    return self._stopped_status()
                lead = await self.elector.try_acquire()
                if lead is None:
                    log.info("another instance leads: CMD not run (--no-wait), exit status %d", self.conflict_status)
                    return self.conflict_status
            else:
                lead = await self._campaign()
            if lead is None:
                log.info("stopped while campaigning")
                return self._stopped_status()
            try:
                status = await self._lead(lead)
            finally:
                await lead.release()
            if status is None:  # lost before CMD could start: it never ran, so campaign again
                if self.no_wait:
                    return self.conflict_status
                continue
            if not self.forever or self.stopping.is_set():
                return status
            log.info("CMD ended with status %d; campaigning again in %gs", status, self.restart_delay)
            with anyio.move_on_after(self.restart_delay):
                await self.stopping.wait()
            if self.stopping.is_set():
                return status

    async def _campaign(self) -> Leadership | None:
        """Acquire in this task (leadership is bound to it); None if stopped first."""
        if self.stopping.is_set():
            return None
        log.info("campaigning as %s", self.elector.identity)
        with anyio.CancelScope() as scope:
            self._campaign_scope = scope
            try:
                lead = await self.elector.acquire()
            finally:
                self._campaign_scope = None
        if scope.cancelled_caught:
            return None
        return lead

    async def _lead(self, lead: Leadership) -> int | None:
        """Run CMD under ``lead``; return its exit status, or None if it could not start as leader."""
        if self.stopping.is_set():
            return self._stopped_status()
        token = "" if lead.token is None else str(lead.token)
        env = child_environment(
            self.environ, pass_secrets=self.pass_secrets, extra={ENV_IDENTITY: lead.identity, ENV_TOKEN: token}
        )
        if not lead.held:  # nothing may start once leadership may have passed on
            log.warning("leadership lost before CMD started (%s)", lead.lost_reason)
            return None
        try:
            # The shim keeps the lock's descriptors: the lock cannot pass on before CMD's tree is gone.
            self.group = group = await start_cmd(self.cmd, env, hold=lock_descriptors(lead))
        except FileNotFoundError:
            log.error("CMD not found: %s", self.cmd[0])
            return EXIT_NOT_FOUND
        except OSError as exc:  # permission denied, exec format error...
            log.error("CMD cannot be executed: %s (%s)", self.cmd[0], exc.strerror)
            return EXIT_NOT_EXECUTABLE
        log.info("leader (token %s): started %s, pid %d", lead.token, os.path.basename(self.cmd[0]), group.pid)
        if self.signals:  # arrived while CMD was being started
            group.signal(self.signals[-1])
        # CMD is the leader's work: on a loss the keeper cancels this scope, then releases the
        # lock only once CMD's whole tree is gone (the finally below).
        with lead.guard():
            try:
                waiters = [lambda: asyncio.wait([group.exited]), lead.wait_lost]
                if self.serve_step_down:
                    # `aioelect step-down` asks through the backend: acting on it releases through the keeper.
                    waiters.append(lambda: serve_step_downs(lead))
                await first_of(*waiters)
            finally:
                with anyio.CancelScope(shield=True):
                    try:
                        await self._stop_group(lead, group)
                    finally:
                        await group.aclose()
        status = await group.status()
        log.info("CMD exited with status %d", status)
        return status

    async def _stop_group(self, lead: Leadership, group: ProcessGroup) -> None:
        """Leave nothing of CMD's tree running; called before every release."""
        if not group.exited.done():
            if lead._stepping is not None:  # a planned step-down: CMD gets its grace, as on a loss
                log.info("stepping down: stopping CMD (pid %d)", group.pid)
                await group.terminate(self.grace)
                return
            if not lead.lost:  # cancelled ourselves: never leave CMD running
                await group.kill()
                return
            log.warning(
                "leadership lost (%s): stopping CMD (pid %d) and every process it started", lead.lost_reason, group.pid
            )
        elif group.alive():
            log.warning(
                "processes CMD started (pid %d) are still running after CMD exited: stopping them before the "
                "leadership is released",
                group.pid,
            )
        else:
            return
        await group.terminate(self.grace)
