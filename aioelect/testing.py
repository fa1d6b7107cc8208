"""What users need to test their own code: an in-memory election they can make lose leadership on purpose.

:class:`MemoryElector` is an :class:`~aioelect.Elector` like the others, with
the same guarantees: the same :class:`~aioelect.Leadership`, keeper,
self-fencing, :func:`~aioelect.leadership` and :meth:`~aioelect.Elector.run`.
Only its backend is in memory: electors of the same name in one event loop
share one election, and nothing starts, listens or leaves the process. Its
controls make leadership go in milliseconds:

* :meth:`MemoryElector.depose` -- the leader loses leadership at once, with
  a reason (``async with leadership(...)`` raises
  :class:`~aioelect.LeadershipLost`);
* :meth:`MemoryElector.stall` -- the leader's confirmations stop, so it
  fences itself at its ``renew_deadline``;
* :meth:`MemoryElector.fail` -- the "server" fails: campaigns retry with
  ``error`` events, :meth:`~aioelect.Elector.leader` raises
  :class:`~aioelect.BackendUnavailable`, the leader fences itself;
* :meth:`MemoryElector.restore` -- undoes :meth:`~MemoryElector.fail` and
  :meth:`~MemoryElector.stall`.

The pytest fixtures ``aioelect_name`` and ``memory_elector`` come with the
package (module :mod:`aioelect.pytest_plugin`, loaded by pytest through its
``pytest11`` entry point).
"""

from __future__ import annotations

from ._config import DEFAULT_NAME
from ._elector import Elector
from .backends.memory import DEFAULT_RENEW_DEADLINE, MemoryBackend, MemoryElection

__all__ = ["MemoryElector"]


class MemoryElector(Elector):
    """A candidate in an in-memory election, shared by the electors of ``name`` in the running event loop.

    Guarantees (beyond :class:`~aioelect.Elector`'s):

    * one leader at a time among the electors of ``name`` in one event loop;
      a candidate waiting takes over in the event loop iteration after a
      release, and candidates lead in the order they began to wait;
    * tokens of ``name`` increase by one with each leadership, from 1 in
      each event loop;
    * :meth:`observe` reports each change at once (no polling);
    * a leader confirms every ``check_interval`` seconds (default a quarter of
      ``renew_deadline``) and fences itself after ``renew_deadline`` seconds
      (default 0.5) without a confirmation: short, so that a test of a
      stalled or cut-off leader takes a fraction of a second. A test whose
      event loop is blocked for longer than ``renew_deadline`` sees the
      leadership fenced, as a real leader would be.

    The controls act on the election of ``name`` in the running event loop
    (whoever leads it) and must be called from code running in that loop.
    """

    def __init__(
        self,
        *,
        name: str = DEFAULT_NAME,
        identity: str | None = None,
        stop_timeout: float = 5.0,
        renew_deadline: float = DEFAULT_RENEW_DEADLINE,
        check_interval: float | None = None,
    ) -> None:
        backend = MemoryBackend(name, renew_deadline=renew_deadline, check_interval=check_interval)
        Elector.__init__(self, backend, identity=identity, stop_timeout=stop_timeout)
        self._memory = backend

    @property
    def election(self) -> MemoryElection:
        """The shared state of this elector's election in the running event loop."""
        return self._memory.election()

    def depose(self, reason: str = "deposed by the test") -> str:
        """Take leadership away from whoever leads this election; return the deposed identity.

        The leader's leadership is lost at once with ``reason`` as its
        ``lost_reason``: its work is cancelled and ``async with
        leadership(...)`` raises :class:`~aioelect.LeadershipLost`. The first
        candidate waiting leads next. Raises :class:`LookupError` when nobody
        leads.
        """
        return self.election.depose(reason)

    def stall(self) -> str:
        """Stop the current leader's confirmations; return its identity.

        It fences itself ``renew_deadline`` seconds after its last
        confirmation (``lost_reason`` names the renew deadline), then lets go.
        Raises :class:`LookupError` when nobody leads.
        """
        return self.election.stall()

    def fail(self, reason: str = "memory server failed by the test") -> None:
        """Make this election's "server" unavailable until :meth:`restore`.

        Campaigns keep waiting and emit an ``error`` event (and a WARNING) each
        time they retry; :meth:`leader` raises
        :class:`~aioelect.BackendUnavailable`; the leader cannot confirm and
        fences itself at its renew deadline.
        """
        self.election.fail(reason)

    def restore(self) -> None:
        """Undo :meth:`fail` and :meth:`stall`: waiting campaigns go on at once."""
        self.election.restore()
