"""FastAPI: every instance serves requests; leader-only routes answer 503 on the others.

Run it as any FastAPI application, on each instance::

    uvicorn web_fastapi:app --host 0.0.0.0 --port 8000
"""

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, FastAPI, Request

import aioelect
from aioelect.integrations.asgi import campaign_of, campaigning, leader_required, status_route

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # The application's own start-up and shutdown go around the campaign.
    async with aioelect.from_env() as elector, campaigning(app, elector):
        yield


app = FastAPI(lifespan=lifespan)
app.router.routes.append(status_route("/leader"))


@app.post("/reindex")
async def reindex(lead: Annotated[aioelect.Leadership, Depends(leader_required)]) -> dict[str, object]:
    # Depends(leader_required) answers 503 unless this instance leads.
    lead.check()  # right before acting: raises LeadershipLost if the leadership may have passed on
    return {"reindexed": True, "token": lead.token}


@app.get("/role")
async def role(request: Request) -> dict[str, object]:
    # Any handler reaches the campaign; its leadership is None unless this instance leads.
    lead = campaign_of(request).leadership
    return {"leading": lead is not None, "token": lead.token if lead is not None else None}
