"""aiohttp: campaign in a ``cleanup_ctx`` entry, serve followers too (extra ``aiohttp``).

::

    from aiohttp import web
    import aioelect
    from aioelect.integrations.aiohttp import CAMPAIGN, election_ctx, status_handler

    app = web.Application()
    app.cleanup_ctx.append(election_ctx(aioelect.from_env))
    app.router.add_get("/leader", status_handler)
    # leader-only work: request.config_dict[CAMPAIGN].leadership (None unless this instance leads)
    web.run_app(app)

Guarantees:

* the campaign runs in a background task: the application serves at
  once, on the leader and on the followers alike;
* :func:`status_handler` answers ``200`` with a JSON object on every
  instance: ``role`` (``leader``/``follower``, or ``failed`` after a
  permanent error), ``identity``, ``leader`` (the current leader's
  identity), ``token`` (while leading), ``backend``, ``name``;
  :func:`leader_only_handler` answers ``503`` unless this instance leads;
* leader work that returns gives the leadership up (it is released, and
  the campaign starts again a second later);
* at cleanup the leadership is released (leader work stopped first); an
  elector built from a factory (``aioelect.from_env``) is closed, one given
  as such is left open, so the application can start again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from ..core._elector import Elector
from ._campaign import Campaign, LeaderWork

try:
    from aiohttp import web
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("aioelect.integrations.aiohttp needs aiohttp: pip install 'aioelect[aiohttp]'") from exc

__all__ = ["CAMPAIGN", "election_ctx", "leader_only_handler", "status_handler"]

#: The application key of the :class:`Campaign` (``request.config_dict[CAMPAIGN]`` in sub-applications too).
CAMPAIGN: web.AppKey[Campaign] = web.AppKey("aioelect_campaign", Campaign)


def election_ctx(
    elector: Elector | Callable[[], Elector], work: LeaderWork | None = None
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` entry: campaign from startup to cleanup, in the background.

    ``elector`` is an :class:`~aioelect.Elector` or a factory such as
    :func:`aioelect.from_env`: a factory is called at each startup and the
    elector it built closed at cleanup; an elector given as such is
    released at cleanup and left open (whoever built it closes it).
    """

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        owned = not isinstance(elector, Elector)
        built = elector() if owned else elector  # type: ignore[operator]
        if not isinstance(built, Elector):
            raise TypeError(f"election_ctx() needs an Elector or a callable that returns one, not {built!r}")
        campaign = Campaign(built, work)
        app[CAMPAIGN] = campaign
        await campaign.start()
        try:
            yield
        finally:
            await campaign.stop(close=owned)

    return ctx


async def _respond(request: web.Request, leader_only: bool) -> web.Response:
    campaign = request.config_dict.get(CAMPAIGN)
    if campaign is None:
        raise RuntimeError("no aioelect campaign in this application: app.cleanup_ctx.append(election_ctx(elector))")
    now = await campaign.status()
    failing = now.role in ("failed", "stopped") or (leader_only and not now.leading)
    return web.json_response(now.as_dict(), status=503 if failing else 200, headers={"Cache-Control": "no-store"})


async def status_handler(request: web.Request) -> web.Response:
    """This instance's role, identity, the current leader and its token while leading (JSON, 200)."""
    return await _respond(request, leader_only=False)


async def leader_only_handler(request: web.Request) -> web.Response:
    """As :func:`status_handler`, but ``503`` unless this instance leads."""
    return await _respond(request, leader_only=True)
