"""A job every instance fires on its own clock, run only by the elected leader.

Run it on each instance; SIGTERM or Ctrl-C stops it and hands the leadership over::

    python leader_only_jobs.py
"""

import asyncio
import logging
import signal

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
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    async with leader_only:
        while not stopping.is_set():
            await send_digest()  # runs on the leader; returns None at once on the others
            await asyncio.wait([asyncio.ensure_future(stopping.wait())], timeout=1)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main())
