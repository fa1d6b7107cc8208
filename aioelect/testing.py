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

from .wiring._electors import MemoryElector

__all__ = ["MemoryElector"]
