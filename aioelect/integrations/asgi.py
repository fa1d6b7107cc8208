"""Starlette and FastAPI: campaign in the application's lifespan, serve followers too (extra ``asgi``).

::

    from starlette.applications import Starlette
    import aioelect
    from aioelect.integrations.asgi import election_lifespan, status_route

    app = Starlette(lifespan=election_lifespan(aioelect.from_env()), routes=[status_route("/leader")])

FastAPI takes the same two: ``FastAPI(lifespan=election_lifespan(elector))``
and ``app.router.routes.append(status_route("/leader"))``. An application
with a lifespan of its own enters :func:`campaigning` inside it instead.

Guarantees:

* the campaign runs in a background task: the application starts serving
  at once, on the leader and on the followers alike; leader-only work
  reads :attr:`Campaign.leadership` (None unless this instance leads) or
  is given to :class:`~aioelect.integrations.Campaign` as its ``work``;
* the status route answers ``200`` with a JSON object on every instance:
  ``role`` (``leader``/``follower``, or ``failed`` after a permanent
  error), ``identity``, ``leader`` (the current leader's identity),
  ``token`` (while leading), ``backend``, ``name``; with
  ``leader_only=True`` it answers ``503`` unless this instance leads (for
  a load balancer that should reach the leader only);
* at shutdown the leadership is released (leader work stopped first) and
  the elector closed, before the lifespan returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from .._elector import Elector
from ._campaign import Campaign, LeaderWork

try:
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("aioelect.integrations.asgi needs Starlette: pip install 'aioelect[asgi]'") from exc

__all__ = ["STATE_KEY", "campaigning", "election_lifespan", "status", "status_route"]

#: Where the lifespan keeps the :class:`Campaign`: ``app.state.aioelect`` and ``request.state.aioelect``.
STATE_KEY = "aioelect"


@contextlib.asynccontextmanager
async def campaigning(app: Any, elector: Elector, work: LeaderWork | None = None) -> AsyncIterator[Campaign]:
    """Campaign in the background for as long as the ``async with`` lasts; keep the campaign in ``app.state``."""
    campaign = Campaign(elector, work)
    setattr(app.state, STATE_KEY, campaign)
    await campaign.start()
    try:
        yield campaign
    finally:
        await campaign.stop()


def election_lifespan(
    elector: Elector, work: LeaderWork | None = None
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[dict[str, Any]]]:
    """A Starlette/FastAPI ``lifespan`` that campaigns on ``elector`` while the application runs.

    Its state (``request.state.aioelect``) is the :class:`Campaign`.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
        async with campaigning(app, elector, work) as campaign:
            yield {STATE_KEY: campaign}

    return lifespan


def _campaign_of(request: Request) -> Campaign:
    campaign = getattr(request.state, STATE_KEY, None) or getattr(request.app.state, STATE_KEY, None)
    if not isinstance(campaign, Campaign):
        raise RuntimeError(
            "no aioelect campaign in this application: give it lifespan=election_lifespan(elector), "
            "or enter campaigning(app, elector) in its own lifespan"
        )
    return campaign


async def status(request: Request, *, leader_only: bool = False) -> JSONResponse:
    """This instance's role, identity, the current leader and its token while leading (JSON)."""
    now = await _campaign_of(request).status()
    failing = now.role in ("failed", "stopped") or (leader_only and not now.leading)
    return JSONResponse(now.as_dict(), status_code=503 if failing else 200, headers={"Cache-Control": "no-store"})


def status_route(path: str = "/leader", *, leader_only: bool = False) -> Route:
    """A ``GET`` route at ``path`` answering :func:`status`."""

    async def endpoint(request: Request) -> JSONResponse:
        return await status(request, leader_only=leader_only)

    return Route(path, endpoint, methods=["GET"], name="aioelect_status")
