"""Ready-made glue between an elector and the frameworks that run leader-only work or serve requests.

Each module imports its framework only when it is imported itself, so
``import aioelect`` never loads any of them:

* :mod:`aioelect.integrations.apscheduler` -- an APScheduler 3.x
  ``AsyncIOScheduler`` whose jobs run only while this instance leads
  (extra ``apscheduler``);
* :mod:`aioelect.integrations.asgi` -- a Starlette/FastAPI lifespan that
  campaigns in the background, and a route showing the role (extra ``asgi``);
* :mod:`aioelect.integrations.aiohttp` -- the same for aiohttp, as a
  ``cleanup_ctx`` entry and a handler (extra ``aiohttp``);
* :mod:`aioelect.integrations.jobs` -- :class:`~aioelect.integrations.jobs.LeaderOnly`,
  a decorator whose async functions run only on the elected leader
  (standard library only);
* :mod:`aioelect.integrations.schedule` -- ticks of an "every N seconds"
  schedule, each recorded in the election's fenced state before it runs, so
  that none runs twice across the instances (standard library only);
* :mod:`aioelect.integrations.health` -- liveness, readiness and leader
  probes over plain HTTP (standard library only), which ``aioelect run
  --health-port`` serves for Kubernetes;
* :class:`Campaign` -- what they share: campaign in a background task, run
  leader work while leading, campaign again after a loss, report the role.
"""

from __future__ import annotations

from ._campaign import Campaign, Status

__all__ = ["Campaign", "Status"]
