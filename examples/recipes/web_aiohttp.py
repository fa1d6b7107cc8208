"""aiohttp: every instance serves requests; leader-only routes answer 503 on the others.

Run it on each instance (``PORT`` chooses the port, 8080 by default)::

    python web_aiohttp.py
"""

import logging
import os

from aiohttp import web

import aioelect
from aioelect.integrations.aiohttp import CAMPAIGN, election_ctx, leader_only_handler, status_handler


async def reindex(request: web.Request) -> web.Response:
    lead = request.config_dict[CAMPAIGN].leadership  # None unless this instance leads
    if lead is None:
        raise web.HTTPServiceUnavailable(text="this instance does not lead")
    lead.check()  # right before acting: raises LeadershipLost if the leadership may have passed on
    return web.json_response({"reindexed": True, "token": lead.token})


def make_app() -> web.Application:
    app = web.Application()
    # aioelect.from_env is called at start-up; the elector it builds is closed at cleanup.
    app.cleanup_ctx.append(election_ctx(aioelect.from_env))
    app.router.add_get("/leader", status_handler)
    app.router.add_get("/leader-only", leader_only_handler)
    app.router.add_post("/reindex", reindex)
    return app


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    web.run_app(make_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))
