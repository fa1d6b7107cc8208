"""Local leadership WITHOUT mutual exclusion while etcd has never answered (``degrade_to_local=True``, opt-in).

Guarantees: a :class:`DegradedHold` lasts only until etcd answers this
elector. It asks etcd every ``interval`` (and notices any other request of
the elector that etcd answers, ``leader()`` included) and is lost as soon as
one is answered, with a reason starting "etcd answered", so that the next
campaign is on etcd.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from ...core._backend import Confirm, Hold, Loss, monotonic
from ...core._errors import ElectionError, LossKind
from ...core._tasks import first_of
from ._connection import Connection
from ._failures import Transient

__all__ = ["ETCD_ANSWERED", "DegradedHold"]

#: Why a degraded leadership ends.
ETCD_ANSWERED = "etcd answered: the local leadership taken without mutual exclusion ends; campaign on etcd"


class DegradedHold(Hold):
    """Local leadership while ``conn`` has never had an answer from etcd.

    ``ask`` is one request to etcd (its result is ignored: only whether etcd
    answered counts); ``on_release`` is called once the leadership is given up.
    """

    def __init__(
        self,
        conn: Connection,
        identity: str,
        *,
        interval: float,
        ask: Callable[[], Awaitable[object]],
        on_release: Callable[[DegradedHold], None],
    ) -> None:
        self._conn = conn
        self._identity = identity
        self._interval = interval
        self._ask = ask
        self._on_release = on_release
        self.acquired_at = monotonic()

    async def monitor(self, confirm: Confirm) -> Loss:
        # etcd, reachable again, takes the election back from the local leadership.
        _, reason = await first_of(lambda: self._confirm_on_time(confirm), self._until_etcd_answers)
        return Loss(LossKind.RELEASED_BY_SERVER, str(reason))

    async def _confirm_on_time(self, confirm: Confirm) -> None:
        # Nothing to renew: confirm on time so that the keeper's renew deadline does not fence us.
        while True:
            confirm(monotonic())
            await anyio.sleep(self._interval)

    async def _until_etcd_answers(self) -> str:
        conn = self._conn
        while not conn.ever_answered:
            try:
                await self._ask()
            except Transient as exc:
                conn.log.debug("etcd still unreachable (%s); leading locally", exc)
            except ElectionError as exc:
                return f"{ETCD_ANSWERED} ({exc})"
            if not conn.ever_answered:
                await anyio.sleep(self._interval)
        return ETCD_ANSWERED

    async def release(self) -> None:
        self._on_release(self)

    @property
    def identity(self) -> str:
        return self._identity
