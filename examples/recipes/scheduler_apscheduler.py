"""APScheduler: the same scheduler runs in every instance; only the leader runs its jobs.

Run it on each instance; SIGTERM or Ctrl-C stops it and hands the leadership over::

    python scheduler_apscheduler.py
"""

import asyncio
import logging

from apscheduler.schedulers.asyncio import AsyncIOScheduler

import aioelect
from aioelect.integrations.apscheduler import LeaderScheduler

log = logging.getLogger("reports")

#: Seconds a run that fell due while no instance led may be late and still run once on the new leader.
#: Longer than any handover (a backend's failover, see "Choosing a backend"): APScheduler's default is 1 s.
MISFIRE_GRACE_TIME = 15 * 60


async def write_report(kind: str, fencing_token: int | None) -> None:
    # Stands in for the real write: the storage records the largest token it has seen and refuses an older one.
    log.info("%s report written with token %s", kind, fencing_token)


async def nightly_report() -> None:
    lead = aioelect.current_leadership()  # the leadership this run belongs to
    lead.check()  # raises LeadershipLost if it is gone
    await write_report("nightly", fencing_token=lead.token)


async def refresh_cache() -> None:
    lead = aioelect.current_leadership()
    lead.check()
    log.info("cache refreshed with token %s", lead.token)


def build_scheduler() -> AsyncIOScheduler:
    scheduler = AsyncIOScheduler()
    grace = {"coalesce": True, "misfire_grace_time": MISFIRE_GRACE_TIME}
    scheduler.add_job(nightly_report, "cron", hour=2, id="nightly-report", **grace)
    scheduler.add_job(refresh_cache, "interval", seconds=1, id="refresh-cache", **grace)
    return scheduler


async def main() -> None:
    # Resumes the scheduler while this instance leads, pauses it otherwise; leaving releases the leadership.
    async with LeaderScheduler(build_scheduler(), aioelect.from_env()):
        await asyncio.Event().wait()  # until SIGTERM or Ctrl-C


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    aioelect.run(main())  # SIGTERM or Ctrl-C cancels main(): the jobs stop, then the leadership is released
