"""The ``aioelect`` commands on a running event loop: ``leader``, ``observe``, ``run`` through :class:`Runner`, and
``shards`` through :class:`~aioelect.cli._shards.ShardsRunner`.

Guarantees: the first contact with the server is bounded by ``--timeout``
and a server that cannot be reached then ends the command with status 3;
SIGINT and SIGTERM end ``observe`` with status 0, ``leader`` as a death by
that signal would; ``run`` forwards each of :data:`STOP_SIGNALS` to CMD
and stops, and as PID 1 reaps the orphans it is handed; the elector is
closed (bounded) however the command ends.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import signal
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, cast

import anyio

from .._early import take
from .._http import BoundedHTTPServer
from .._requests import request_step_down
from ..core._backend import Backoff
from ..core._elector import Elector
from ..core._errors import BackendUnavailable, ElectionError
from ..core._errors import UsageError as LibraryUsageError
from ..core._handover import note_fields
from ..integrations.health import HealthServer
from ..wiring._factory import priority_from
from ..wiring._settings import ENV_PRIORITY
from ._configure import Config, first_contact
from ._orphans import reaper
from ._output import json_line, out
from ._run import Runner, choose_grace, health_check, serve_health, serve_metrics
from ._status import EXIT_NO_LEADER, EXIT_NOT_STEPPED_DOWN, BackendError, UsageError
from ._supervisor import STOP_SIGNALS, stop_timeout_for

__all__ = ["execute"]

log = logging.getLogger("aioelect.cli")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def _handover(elector: Elector) -> dict[str, Any] | None:
    """The handover in progress in ``elector``'s election, as printed; None if there is none (or it is unread)."""
    gate = elector._gate
    note, _ = await gate.read()
    return note_fields(note, gate.left)


async def _leader(elector: Elector, config: Config, args: argparse.Namespace) -> int:
    who = await first_contact(elector, config, args.timeout)
    if args.json:
        out(json_line({"leader": who, "handover": await _handover(elector)}))
    elif who is not None:
        out(who)
    else:
        log.info("no leader")
    return 0 if who is not None else EXIT_NO_LEADER


async def _observe(elector: Elector, config: Config, args: argparse.Namespace) -> int:
    async def emit(who: str | None) -> None:
        if args.json:
            handover = await _handover(elector)
            out(
                json_line(
                    {"time": _now(), "leader": who, "backend": config.kind, "name": elector.name, "handover": handover}
                )
            )
        else:
            out(f"{_now()}  " + (f"leader {who}" if who is not None else "no leader"))

    await first_contact(elector, config, args.timeout)  # fail fast (status 3) on a server that cannot be reached
    last: object = object()
    started = False
    backoff = Backoff(first=0.5, maximum=5.0)
    while True:
        changes = cast(AsyncGenerator[Any, None], elector.observe())
        try:
            if not started:
                try:
                    with anyio.fail_after(args.timeout):
                        who = await changes.__anext__()
                except TimeoutError:
                    raise BackendError(
                        f"{config.kind} at {config.where} did not answer within {args.timeout:g}s"
                    ) from None
                started = True
                last = who
                await emit(who)
            async for who in changes:
                backoff.reset()
                if who != last:
                    last = who
                    await emit(who)
            return 0
        except (BackendUnavailable, OSError) as exc:
            if not started:
                detail = str(exc) if isinstance(exc, BackendUnavailable) else f"unreachable: {exc}"
                raise BackendError(f"{config.kind} at {config.where}: {detail}") from None
            delay = backoff.next_delay()
            log.warning("lost contact with %s (%s); retrying in %.1fs", config.kind, exc, delay)
            await anyio.sleep(delay)
        except ElectionError as exc:
            raise BackendError(str(exc)) from None
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await changes.aclose()


async def _step_down(elector: Elector, config: Config, args: argparse.Namespace) -> int:
    who = await first_contact(elector, config, args.timeout)
    if who is None:
        log.error("nobody leads %s: nothing to step down", elector.name)
        return EXIT_NO_LEADER
    if args.to is not None and who == args.to:
        # A leader never acts on a request naming itself: nothing to ask.
        log.info("%s leads already", who)
        out(json_line({"leader": who, "was": who, "to": args.to}) if args.json else who)
        return 0
    try:
        await request_step_down(elector, to=args.to, timeout=args.window, lapse=args.wait)
    except LibraryUsageError as exc:
        raise UsageError(str(exc)) from None
    log.info("asked %s to step down%s", who, f" to {args.to}" if args.to else "")
    now: str | None = who
    with anyio.move_on_after(args.wait):
        while now == who:
            await anyio.sleep(0.1)
            now = await elector.leader()
    if now == who:
        log.error(
            "%s did not step down within %gs (only a leader that serves them does: --serve-step-down)", who, args.wait
        )
        return EXIT_NOT_STEPPED_DOWN
    # The successor, once it leads (none: printed as null). A candidate the handover excludes may hold the lock
    # for the moment it takes to give it back: it is not the successor.
    with anyio.move_on_after(args.wait):
        while now is None or (args.to is not None and now != args.to):
            await anyio.sleep(0.1)
            now = await elector.leader()
    if args.json:
        out(json_line({"leader": now, "was": who, "to": args.to}))
    elif now is not None:
        out(now)
    return 0


async def execute(
    command: str, config: Config, args: argparse.Namespace, cmd: Sequence[str], environ: Mapping[str, str]
) -> int:
    """Run ``command``; ``environ`` is what CMD's environment is made from (``run``)."""
    if command == "shards":
        from ._shards import ShardsRunner

        return await ShardsRunner(config, cmd, args, environ).main()
    elector = config.build()
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    runner = Runner(elector, cmd, args, environ) if command == "run" else None
    interrupted: list[int] = []
    health: HealthServer | None = None
    metrics: BoundedHTTPServer | None = None

    def on_signal(sig: int) -> None:
        if runner is not None:
            runner.on_signal(sig)
        elif not interrupted:
            interrupted.append(sig)
            main_task.cancel()

    # run: every signal that would otherwise end aioelect (and leave CMD leaderless) stops it like SIGTERM.
    handled = STOP_SIGNALS if runner is not None else (signal.SIGINT, signal.SIGTERM)
    for sig in handled:
        loop.add_signal_handler(sig, on_signal, sig)
    for sig in take(handled):  # received while the command was starting (python -m aioelect held them)
        on_signal(sig)
    reaping = reaper() if runner is not None else None
    try:
        check = health_check(args, environ) if runner is not None else None
        if check is not None:
            elector.set_health(
                check,
                failures=args.health_failures,
                interval=args.health_interval,
                timeout=args.health_timeout,
                backoff=args.health_backoff,
            )
        if runner is not None:
            try:
                priority = args.priority if args.priority is not None else priority_from(environ.get(ENV_PRIORITY))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            if priority is not None:
                elector.set_priority(priority, settle=args.priority_settle)
            runner.grace = choose_grace(args.grace, elector, config.kind)
            log.debug("--grace %gs", runner.grace)
            needed = stop_timeout_for(runner.grace)
            if config.options.get("stop_timeout", 0.0) < needed:
                # A grace chosen from the margin (half of it, none given) may outlast the stop_timeout the
                # elector was built with: after a loss its keeper would let the lock go while CMD still runs.
                config.options["stop_timeout"] = needed
                with anyio.CancelScope(shield=True):
                    await elector.aclose()
                elector = runner.elector = config.build()
        if runner is not None and args.metrics_port is not None:
            metrics = await serve_metrics(elector, args.metrics_host, args.metrics_port)
        if runner is not None and getattr(args, "health_port", None) is not None:
            health = await serve_health(elector, args.health_host, args.health_port)
        if runner is not None:
            # Fail fast on a server that cannot be reached at all; later outages are retried.
            probe = config.build()
            try:
                await first_contact(probe, config, args.timeout)
            finally:
                with anyio.CancelScope(shield=True):
                    await probe.aclose()
            return await runner.main()
        if command == "leader":
            return await _leader(elector, config, args)
        if command == "step-down":
            return await _step_down(elector, config, args)
        return await _observe(elector, config, args)
    except asyncio.CancelledError:
        if not interrupted:
            raise
        # Interrupted: observe ends normally, leader as a death by that signal would.
        return 0 if command == "observe" else 128 + interrupted[0]
    except ElectionError as exc:  # permanent: wrong password, unknown database...
        raise BackendError(str(exc)) from None
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            if reaping is not None:
                await reaping.aclose()
            if health is not None:
                await health.aclose()
            if metrics is not None:
                await metrics.aclose()
            await elector.aclose()
