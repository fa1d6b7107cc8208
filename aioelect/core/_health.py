"""Health checks that decide whether a candidate campaigns and whether a leader steps aside.

A check is an async callable: it passes if it returns anything but False,
and fails if it returns False, raises, or runs past its own ``timeout``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

import anyio

from ._backend import monotonic
from ._config import positive
from ._log import ElectionLog

__all__ = ["Health"]


@dataclasses.dataclass
class Health:
    """A health check and how it is applied (see :meth:`aioelect.Elector.set_health`)."""

    check: Callable[[], Awaitable[object]]
    #: Failures in a row that make a leader step down.
    failures: int = 3
    #: Seconds between two checks.
    interval: float = 5.0
    #: Seconds one check may take; past them it has failed (a hung check never holds anything up longer).
    timeout: float = 2.0
    #: Seconds a leader that stepped down unhealthy stays out of the election.
    backoff: float = 30.0
    #: Until when (monotonic) this candidate stays out after stepping down unhealthy.
    out_until: float = 0.0

    def __post_init__(self) -> None:
        if not callable(self.check):
            raise TypeError(f"health= takes an async callable, not {type(self.check).__name__}")
        if isinstance(self.failures, bool) or not isinstance(self.failures, int) or self.failures < 1:
            raise ValueError(f"failures must be a whole number >= 1, not {self.failures!r}")
        self.interval = positive("interval", self.interval)
        self.timeout = positive("timeout", self.timeout)
        self.backoff = positive("backoff", self.backoff)

    async def problem(self) -> str | None:
        """Run the check once: None if it passed, else why it failed."""
        try:
            with anyio.fail_after(self.timeout):
                result = await self.check()
        except TimeoutError:
            return f"health check did not answer within {self.timeout:g}s"
        except Exception as exc:
            return f"health check raised {exc!r}"[:300]
        return "health check returned False" if result is False else None

    async def until_healthy(self, log: ElectionLog) -> None:
        """Return once the back-off (if any) is over and a check passes; each change is logged with its reason."""
        said: str | None = None
        while True:
            left = self.out_until - monotonic()
            if left > 0:
                log.info("stepped down unhealthy: staying out of the election for %.1fs more", left)
                await anyio.sleep(left)
                continue
            why = await self.problem()
            if why is None:
                if said is not None:
                    log.info("health check passes again: campaigning")
                return
            if why != said:
                log.warning("not campaigning: %s", why)
                said = why
            await anyio.sleep(self.interval)

    async def watch(self, held: Callable[[], bool], step_down: Callable[[], Awaitable[None]], log: ElectionLog) -> None:
        """While ``held()``, check every ``interval``; after ``failures`` failures in a row, ``step_down()``."""
        failed = 0
        while True:
            await anyio.sleep(self.interval)
            if not held():
                return
            why = await self.problem()
            if not held():
                return
            if why is None:
                if failed:
                    log.info("health check passes again after %d failure%s", failed, "" if failed == 1 else "s")
                failed = 0
                continue
            failed += 1
            log.warning("health check failed (%d of %d in a row): %s", failed, self.failures, why)
            if failed >= self.failures:
                log.warning("stepping down: unhealthy (%s); staying out for %gs", why, self.backoff)
                self.out_until = monotonic() + self.backoff
                await step_down()
                return
