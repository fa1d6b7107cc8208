"""``aioelect run``: campaign, run CMD only while leader, and stop it before the leadership can pass on.

Guarantees, on top of :mod:`aioelect.cli._supervisor`'s:

* CMD starts only while this process holds the leadership, in the task
  the leadership is bound to;
* on a loss CMD's process group gets SIGTERM, then SIGKILL after the
  grace, and the lock is released only once the group is gone; the grace
  fits in the backend's safety margin (:func:`choose_grace`), so CMD is
  dead before another candidate can lead;
* when CMD exits, processes it left in its group are stopped before the
  release;
* SIGINT and SIGTERM are forwarded to CMD's group, or stop the campaign
  before CMD started.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._elector import Elector, Leadership
from .._settings import ENV_IDENTITY, ENV_TOKEN
from ._status import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_NOT_LEADER, UsageError
from ._supervisor import DEFAULT_GRACE, KILL_RESERVE, ProcessGroup, child_environment

if TYPE_CHECKING:
    from ..integrations.health import HealthServer

__all__ = ["Runner", "check_metrics", "choose_grace", "serve_health", "serve_metrics"]

log = logging.getLogger("aioelect.cli")


def _safety_margin(elector: Elector) -> tuple[float, float, float] | None:
    """``(margin, lease, renew_deadline)``: how long before a cut-off leader's lock can pass on it knows of
    its loss; None for a backend whose leadership cannot be taken away while this process lives."""
    timing = elector.lock_timing()
    if timing is None:
        return None
    lease, deadline = timing
    return lease - deadline, lease, deadline


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
            f"are kept for SIGKILL; give --grace {limit:.3g} or less, or a longer {longer}"
        )
    if limit == 0:
        log.warning(
            "the %s backend's safety margin (%.3gs) leaves no time for SIGTERM: after a loss CMD gets SIGKILL at "
            "once, and may still run briefly after the lock can pass on; use a longer %s",
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


def serve_metrics(elector: Elector, host: str, port: int) -> None:
    """Expose ``elector``'s metrics on ``host:port`` (a daemon thread that ends with the process)."""
    import prometheus_client

    from ..metrics import PrometheusMetrics

    # A registry of our own (main() may run more than once in a process), with the usual process metrics.
    registry = prometheus_client.CollectorRegistry()
    for collector in (prometheus_client.ProcessCollector, prometheus_client.PlatformCollector):
        collector(registry=registry)
    prometheus_client.GCCollector(registry=registry)
    metrics = PrometheusMetrics(registry)
    metrics.attach(elector)
    try:
        metrics.serve(port, host=host)
    except OSError as exc:
        raise UsageError(f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    log.info("metrics on http://%s:%d/metrics", host if ":" not in host else f"[{host}]", port)


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
        self.no_wait: bool = getattr(args, "no_wait", False)
        if self.no_wait and self.forever:
            raise UsageError("--no-wait and --forever exclude each other: --no-wait runs CMD at most once")
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
                    log.info("another instance leads: CMD not run (--no-wait), exit status %d", EXIT_NOT_LEADER)
                    return EXIT_NOT_LEADER
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
                    return EXIT_NOT_LEADER
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
            self.group = group = await ProcessGroup.start(self.cmd, env)
        except FileNotFoundError:
            log.error("CMD not found: %s", self.cmd[0])
            return EXIT_NOT_FOUND
        except OSError as exc:  # permission denied, exec format error...
            log.error("CMD cannot be executed: %s (%s)", self.cmd[0], exc.strerror)
            return EXIT_NOT_EXECUTABLE
        log.info("leader (token %s): started %s, pid %d", lead.token, os.path.basename(self.cmd[0]), group.pid)
        if self.signals:  # arrived while CMD was being started
            group.signal(self.signals[-1])
        lost = asyncio.ensure_future(lead.wait_lost())
        # CMD is the leader's work: on a loss the keeper cancels this scope, then releases the
        # lock only once CMD's whole process group is gone (the finally below).
        with lead.guard():
            try:
                either: set[asyncio.Future[Any]] = {group.exited, lost}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                with anyio.CancelScope(shield=True):
                    await self._stop_group(lead, group)
        status = await group.status()
        log.info("CMD exited with status %d", status)
        return status

    async def _stop_group(self, lead: Leadership, group: ProcessGroup) -> None:
        """Leave nothing of CMD's process group running; called before every release."""
        if not group.exited.done():
            if not lead.lost:  # cancelled ourselves: never leave CMD running
                await group.kill()
                return
            log.warning(
                "leadership lost (%s): stopping CMD (pid %d) and its process group", lead.lost_reason, group.pid
            )
        elif group.alive():
            log.warning(
                "processes still running in CMD's process group %d after CMD exited: stopping them before the "
                "leadership is released",
                group.pid,
            )
        else:
            return
        await group.terminate(self.grace)
