"""The command line's handover options: health checks, priorities and step-down requests (``run`` and
``step-down``), apart from the rest of the options so that each module stays small."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["add_handover_options", "add_health_options", "add_step_down"]


def add_health_options(
    parser: argparse.ArgumentParser, _positive: Callable[[str], float], _number: Any, *, shards: bool = False
) -> None:
    """The health check options of ``run`` (``shards``: of ``shards``, where an unhealthy instance hands its
    names to the others)."""
    health = parser.add_argument_group("health")
    health.add_argument(
        "--health-cmd",
        metavar="CMD",
        help="a command (split as a shell would, run without one) that exits 0 while this instance is healthy: "
        + (
            "it takes part (owns names) only then, and hands every name to the others after --health-failures "
            "failures in a row"
            if shards
            else "it campaigns only then, and as leader steps down after --health-failures failures in a row"
        ),
    )
    health.add_argument(
        "--health-url",
        metavar="URL",
        help="an http:// or https:// URL (certificate verified) that answers a GET with 2xx while this instance "
        "is healthy, within --health-timeout; no proxy, no redirects; a user:password in it is sent as Basic "
        "authorization and never logged (one with a password is best given as AIOELECT_HEALTH_URL, which ps does "
        "not show and CMD does not get). With --health-cmd, both must pass",
    )
    health.add_argument(
        "--health-interval", type=_positive, default=5.0, metavar="SECONDS", help="between two checks (default 5)"
    )
    health.add_argument(
        "--health-timeout",
        type=_positive,
        default=2.0,
        metavar="SECONDS",
        help="a check still running then is killed and has failed (default 2)",
    )
    health.add_argument(
        "--health-failures",
        type=_number(int, lambda n: n >= 1, "a whole number >= 1"),
        default=3,
        metavar="N",
        help="failures in a row that make "
        + ("this instance hand its names over" if shards else "the leader step down")
        + " (default 3)",
    )
    health.add_argument(
        "--health-backoff",
        type=_positive,
        default=30.0,
        metavar="SECONDS",
        help="how long "
        + ("an instance that handed its names over unhealthy" if shards else "a leader that stepped down unhealthy")
        + " stays out (default 30)",
    )


def add_handover_options(run: argparse.ArgumentParser, _positive: Callable[[str], float], _number: Any) -> None:
    """``run``'s health, priority and step-down serving options."""
    add_health_options(run, _positive, _number)
    run.add_argument(
        "--serve-step-down",
        action="store_true",
        help="while leading, act on `aioelect step-down` requests (polled every second through the backend)",
    )
    run.add_argument(
        "--priority",
        type=int,
        metavar="N",
        help="this instance's priority: waiting and healthy, it asks a leader of lower priority to hand over to it "
        "(after --priority-settle seconds); leadership only moves upwards [AIOELECT_PRIORITY]",
    )
    run.add_argument(
        "--priority-settle",
        type=_positive,
        default=10.0,
        metavar="SECONDS",
        help="how long this instance waits, healthy, before it asks (default 10)",
    )


def add_step_down(
    sub: Any, common: argparse.ArgumentParser, EPILOG: str, fmt: Any, _number: Any
) -> argparse.ArgumentParser:
    """The ``step-down`` command's parser."""
    step_down = sub.add_parser(
        "step-down",
        parents=[common],
        help="ask whoever leads to step down, optionally to --to ID",
        description=(
            "Ask the instance that leads, wherever it runs, to stop its work and release, through the backend "
            "(a request the leader polls: aioelect run --serve-step-down, or --priority). With --to, only that "
            "candidate may lead next for --window seconds; then the election opens to all. Prints the new leader; "
            "exit 1 if nobody leads, 4 if the leader did not step down within --wait seconds."
        ),
        epilog=EPILOG,
        formatter_class=fmt,
    )
    step_down.add_argument("--to", metavar="ID", help="the candidate that alone may lead next")
    step_down.add_argument(
        "--window",
        type=_number(float, lambda n: n > 0, "a number of seconds > 0"),
        default=30.0,
        metavar="SECONDS",
        help="how long only --to (or, without it, anyone but the leader) may lead next (default 30)",
    )
    step_down.add_argument(
        "--wait",
        type=_number(float, lambda n: n > 0, "a number of seconds > 0"),
        default=10.0,
        metavar="SECONDS",
        help="how long the leader has to act on the request before it lapses, and how long the new leader is "
        "waited for after (default 10)",
    )
    step_down.add_argument("--json", action="store_true", help='print {"leader": NEW-LEADER-or-null, ...}')
    return step_down  # type: ignore[no-any-return]
