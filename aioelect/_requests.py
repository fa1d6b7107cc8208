"""Step-downs asked from outside the leader's process: a request posted in the election's backend, and the
leader's side that polls for it.

Any process that can reach the election's server may post a request
(:func:`request_step_down`, ``aioelect step-down``); a leader acts on it
only while it runs :func:`serve_step_downs` (``aioelect run --serve-step-down``), or has a priority.
"""

from __future__ import annotations

import secrets
import time

from .core._config import default_identity, positive, validate_identity
from .core._elector import Elector, Leadership
from .core._handover import Request

__all__ = ["request_step_down", "serve_step_downs"]

#: How long a request waits for a leader to act on it before it lapses, unless told.
DEFAULT_LAPSE = 10.0


async def request_step_down(
    elector: Elector,
    *,
    to: str | None = None,
    timeout: float = 30.0,
    lapse: float = DEFAULT_LAPSE,
) -> str:
    """Ask whoever leads ``elector``'s election to step down (to ``to``, for ``timeout``); return the request's id.

    The request is posted in the election's backend with no token check
    (anyone who can reach the server may ask); the leader acts on it at its
    next poll if it runs :func:`serve_step_downs` (``aioelect run --serve-step-down``),
    and then exactly as :meth:`Leadership.step_down` says. A request no
    leader acted on within ``lapse`` seconds is dropped. A request answers
    one step-down: a later leader ignores it. UsageError where the backend
    keeps no handover notes.
    """
    if to is not None:
        to = validate_identity(to)
    timeout = positive("timeout", timeout)
    lapse = positive("lapse", lapse)
    request = Request(secrets.token_hex(8), to, timeout, time.time() + lapse, default_identity())
    await elector._gate.post(request)
    return request.id


async def serve_step_downs(lead: Leadership, *, interval: float = 1.0) -> None:
    """While ``lead`` is held, poll every ``interval`` seconds for a step-down request and act on the first.

    Run it beside the leader work (in the same task group); it returns once
    the leadership has ended, whether by a request or otherwise. A request
    that names this leader as the successor is already answered: never acted
    on. A request that cannot be read is retried at the next poll (logged at
    WARNING).
    """
    interval = positive("interval", interval)
    await lead._elector._gate.serve(lambda: lead.held, lead._answer, interval, identity=lead.identity)
