"""Starlette and FastAPI: campaign in the application's lifespan, serve followers too (extra ``asgi``).

::

    from starlette.applications import Starlette
    import aioelect
    from aioelect.integrations.asgi import election_lifespan, status_route

    app = Starlette(lifespan=election_lifespan(aioelect.from_env), routes=[status_route("/leader")])

FastAPI takes the same two: ``FastAPI(lifespan=election_lifespan(aioelect.from_env))``
and ``app.router.routes.append(status_route("/leader"))``; a route that may
act only on the leader depends on :func:`leader_required`. An application
with a lifespan of its own enters :func:`campaigning` inside it instead.
``docs/recipes/web.md`` shows complete applications.

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
* leader work that returns gives the leadership up (it is released, and
  the campaign starts again a second later);
* at shutdown the leadership is released (leader work stopped first)
  before the lifespan returns; an elector the lifespan built from a factory
  is closed, one it was given is left open, so the application can start
  again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..core._elector import Elector, Leadership
from ._campaign import Campaign, LeaderWork

try:
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("aioelect.integrations.asgi needs Starlette: pip install 'aioelect[asgi]'") from exc

__all__ = [
    "STATE_KEY",
    "ElectorSource",
    "campaign_of",
    "campaigning",
    "election_lifespan",
    "leader_required",
    "status",
    "status_route",
]

#: Where the lifespan keeps the :class:`Campaign`: ``app.state.aioelect`` and ``request.state.aioelect``.
STATE_KEY = "aioelect"


#: An elector, or a callable without arguments that builds one (``aioelect.from_env``) at each start.
ElectorSource = Elector | Callable[[], Elector]


@contextlib.asynccontextmanager
async def campaigning(app: Any, elector: ElectorSource, work: LeaderWork | None = None) -> AsyncIterator[Campaign]:
    """Campaign in the background for as long as the ``async with`` lasts; keep the campaign in ``app.state``.

    ``elector`` is an :class:`~aioelect.Elector` or a factory such as
    :func:`aioelect.from_env`. A factory is called on entry and the elector
    it built is closed on exit. An elector given as such is released on exit
    (leader work stopped first) and left open, so that the application can
    start again in the same process (a test suite's second client): whoever
    built it closes it.

    ``work(leadership)`` runs while this instance leads and is cancelled on
    a loss. When it returns, the leadership is released and the campaign
    starts again a second later: leader work that must keep leading does not
    return (``await anyio.sleep_forever()`` after starting its tasks).
    """
    owned = not isinstance(elector, Elector)
    built = elector() if owned else elector  # type: ignore[operator]
    if not isinstance(built, Elector):
        raise TypeError(f"campaigning() needs an Elector or a callable that returns one, not {built!r}")
    campaign = Campaign(built, work)
    setattr(app.state, STATE_KEY, campaign)
    await campaign.start()
    try:
        yield campaign
    finally:
        await campaign.stop(close=owned)


def election_lifespan(
    elector: ElectorSource, work: LeaderWork | None = None
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[dict[str, Any]]]:
    """A Starlette/FastAPI ``lifespan`` that campaigns while the application runs, as :func:`campaigning` does.

    Pass a factory (``election_lifespan(aioelect.from_env)``) for a new
    elector at each start, closed at shutdown; an elector given as such is
    released at shutdown and left open. Either way the application can
    start more than once. Its state (``request.state.aioelect``) is the
    :class:`Campaign`.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
        async with campaigning(app, elector, work) as campaign:
            yield {STATE_KEY: campaign}

    return lifespan


def campaign_of(request: Request) -> Campaign:
    """The application's :class:`Campaign`; RuntimeError when it campaigns in no lifespan."""
    campaign = getattr(request.state, STATE_KEY, None) or getattr(request.app.state, STATE_KEY, None)
    if not isinstance(campaign, Campaign):
        raise RuntimeError(
            "no aioelect campaign in this application: give it lifespan=election_lifespan(elector), "
            "or enter campaigning(app, elector) in its own lifespan"
        )
    return campaign


async def status(request: Request, *, leader_only: bool = False) -> JSONResponse:
    """This instance's role, identity, the current leader and its token while leading (JSON)."""
    now = await campaign_of(request).status()
    failing = now.role in ("failed", "stopped") or (leader_only and not now.leading)
    return JSONResponse(now.as_dict(), status_code=503 if failing else 200, headers={"Cache-Control": "no-store"})


def leader_required(request: Request) -> Leadership:
    """This instance's held leadership; ``HTTPException(503)`` unless it leads.

    A FastAPI dependency for routes that may act only on the leader
    (``lead: Leadership = Depends(leader_required)``); a Starlette handler
    calls it with its request. The leadership it returns carries the
    fencing token to pass with each write, and ``check()`` before each act.
    """
    lead = campaign_of(request).leadership
    if lead is None:
        raise HTTPException(503, "this instance does not lead")
    return lead


def status_route(path: str = "/leader", *, leader_only: bool = False) -> Route:
    """A ``GET`` route at ``path`` answering :func:`status`."""

    async def endpoint(request: Request) -> JSONResponse:
        return await status(request, leader_only=leader_only)

    return Route(path, endpoint, methods=["GET"], name="aioelect_status")
