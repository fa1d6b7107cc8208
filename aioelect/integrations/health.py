"""Liveness, readiness and leader probes over plain HTTP, for Kubernetes (standard library only).

``aioelect run --health-port PORT`` serves them; a program serves them
with :class:`HealthServer`::

    health = HealthServer(elector)
    await health.start("0.0.0.0", 8080)    # the pod's address: the kubelet probes it
    ...
    await health.aclose()

Each answers ``GET`` (and ``HEAD``) with a JSON object -- ``role``
(``leader``/``follower``), ``identity``, ``leader``, ``token`` (while
leading), ``backend``, ``name`` -- and a status code:

* ``/healthz`` (liveness): ``200`` while the process runs, its event loop
  answers (the server runs in it) and its campaign has not failed for good;
  else ``503``. An unreachable backend does not fail it: restarting the
  process would not bring the server back.
* ``/readyz`` (readiness): ``200`` while the backend answers (one bounded
  :meth:`~aioelect.Elector.leader` call per probe), on the leader and on
  the followers alike; ``503`` while it does not.
* ``/leader``: ``200`` only while this process leads, else ``503``: the
  readiness probe of a Service that should send traffic to the leader only.

Anything else is ``404``; a method other than ``GET``/``HEAD`` is ``405``.
Each request head is read within 2 seconds and at most :data:`MAX_REQUEST`
bytes, the answer written within :data:`REQUEST_TIMEOUT` seconds, and each
connection closes after one answer. At most ``max_connections`` (default
:data:`MAX_CONNECTIONS`, at most an eighth of the process's file-descriptor
limit) are served at once, at most a quarter of them to one peer address,
and the last quarter only to addresses that hold none; a connection beyond
that is reset at once, so clients that never finish their request cannot
take the descriptors the election needs, nor one client every slot. Failed accepts are logged at
most once per 10 seconds. Nothing served is secret: identities, the
election's name, the token, and a failed campaign's error type and message
with every DSN redacted.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import anyio

from .._http import MAX_CONNECTIONS, MAX_REQUEST, REQUEST_TIMEOUT, BoundedHTTPServer
from ..core._elector import Elector
from ..core._errors import BackendUnavailable, ElectionError, UsageError
from ..core._events import Event
from ._campaign import Campaign, Role, Status

__all__ = ["MAX_CONNECTIONS", "MAX_REQUEST", "PATHS", "REQUEST_TIMEOUT", "HealthServer"]

log = logging.getLogger("aioelect.integrations.health")

#: Liveness, readiness, leader-only: the paths a probe may ask for.
PATHS = ("/healthz", "/readyz", "/leader")


class HealthServer:
    """Serves :data:`PATHS` for ``elector`` on one address, in the running event loop.

    With ``campaign`` (an :class:`~aioelect.integrations.Campaign` driving
    ``elector``), a campaign that failed for good fails ``/healthz``;
    without it the process's own life is its liveness (``aioelect run``
    exits on a permanent error). ``ready_timeout`` bounds the backend call
    of each ``/readyz``; ``max_connections`` the connections served at once.
    """

    def __init__(
        self,
        elector: Elector,
        *,
        campaign: Campaign | None = None,
        ready_timeout: float = 2.0,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if not (0 < ready_timeout < math.inf):
            raise ValueError(f"ready_timeout must be a finite number > 0, not {ready_timeout!r}")
        self.elector = elector
        self.campaign = campaign
        self.ready_timeout = float(ready_timeout)
        self.http = BoundedHTTPServer(self._respond, name="health", max_connections=max_connections, log=log)
        self._started = False
        self._token: int | None = None
        self._remove = elector.add_listener(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.kind == "acquired":
            self._token = event.token
        elif event.kind in ("released", "lost"):
            self._token = None

    @property
    def port(self) -> int:
        """The port listened on (useful after :meth:`start` with port 0)."""
        if not self._started:
            raise UsageError("HealthServer is not started")
        return self.http.port

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (loopback and a free port by default). Raises OSError if it cannot."""
        if self._started:
            raise UsageError("HealthServer.start() called twice")
        # Marked before the first wait: a second start() meanwhile would pass the check and listen again.
        self._started = True
        try:
            await self.http.start(host, port)
        except BaseException:
            self._started = False
            raise

    async def aclose(self) -> None:
        """Stop listening and close open connections. Idempotent."""
        self._remove()
        self._started = False
        await self.http.aclose()

    async def __aenter__(self) -> HealthServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- what the probes see ------------------------------------------------------------------

    def alive(self) -> bool:
        return self.campaign is None or self.campaign.role in ("leader", "follower")

    async def status(self, *, ask_backend: bool) -> tuple[Status, bool]:
        """This process's status and whether the backend answered (asked only with ``ask_backend``)."""
        elector, campaign = self.elector, self.campaign
        leading = elector.leading
        who = elector.identity if leading else elector.last_leader
        answered = True
        if ask_backend:
            try:
                with anyio.fail_after(self.ready_timeout):
                    asked = await elector.leader()
            except (TimeoutError, BackendUnavailable, ElectionError, OSError):
                answered = False
            else:
                who = elector.identity if leading else asked
        role: Role = campaign.role if campaign is not None else ("leader" if leading else "follower")
        lead = campaign.leadership if campaign is not None else None
        token = lead.token if lead is not None else (self._token if leading else None)
        now = Status(
            role=role,
            identity=elector.identity,
            backend=elector.backend,
            name=elector.name,
            leader=who,
            token=token,
            error=campaign.error if campaign is not None else None,
        )
        return now, answered

    async def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        """The status code and JSON object for ``path``."""
        if path not in PATHS:
            return 404, {"error": f"unknown path; probes: {', '.join(PATHS)}"}
        # Liveness never waits on the backend; /leader asks it only when no report named the leader.
        known = self.elector.last_leader is not None
        now, answered = await self.status(ask_backend=path == "/readyz" or (path == "/leader" and not known))
        body = now.as_dict()
        alive = self.alive()
        if path == "/healthz":
            ok = alive
        elif path == "/readyz":
            ok = alive and answered
            body["backend_answered"] = answered
        else:
            ok = alive and now.role == "leader"
        return (200 if ok else 503), body

    # --- HTTP -----------------------------------------------------------------------------------

    async def _respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        code, body = await self.answer(path)
        return code, "application/json", json.dumps(body).encode() + b"\n"
