"""A job every instance fires on its own clock, run only by the elected leader.

Run it on each instance; SIGTERM or Ctrl-C stops it and hands the leadership over::

    python leader_only_jobs.py
"""

import asyncio
import logging

import aioelect
from aioelect.integrations.jobs import LeaderOnly

log = logging.getLogger("digest")

# Campaigns in the background from `async with leader_only` on, and holds the leadership between calls.
leader_only = LeaderOnly(aioelect.from_env)


@leader_only
async def send_digest() -> None:
    lead = aioelect.current_leadership()  # the leadership this run belongs to
    lead.check()  # raises LeadershipLost if it may have passed on
    log.info("digest sent with token %s", lead.token)


async def main() -> None:
    async with leader_only:
        while True:
            await send_digest()  # runs on the leader; returns None at once on the others
            await asyncio.sleep(1)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    aioelect.run(main())  # SIGTERM or Ctrl-C cancels main(): the job stops, then the leadership is released
