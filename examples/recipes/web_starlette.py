"""Starlette: every instance serves requests; only the leader refreshes the prices.

Run it as any Starlette application, on each instance::

    uvicorn web_starlette:app --host 0.0.0.0 --port 8000
"""

import logging

import anyio
from starlette.applications import Starlette

import aioelect
from aioelect.integrations.asgi import election_lifespan, status_route

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
log = logging.getLogger("prices")


async def leader_work(lead: aioelect.Leadership) -> None:
    # Runs only while this instance leads, and is cancelled when the leadership is lost.
    # Returning gives the leadership up (another instance may take it): loop for as long as you lead.
    while True:
        lead.check()  # raises LeadershipLost once the leadership may have passed on
        log.info("prices refreshed with token %s", lead.token)
        await anyio.sleep(1)


app = Starlette(
    # aioelect.from_env is called at each start-up; the elector it builds is closed at shutdown.
    lifespan=election_lifespan(aioelect.from_env, leader_work),
    routes=[status_route("/leader"), status_route("/leader-only", leader_only=True)],
)
