"""The core: written once for every backend, it knows none of them.

From the top down, each module imports only those below it (the "core"
contract of pyproject.toml):

* ``_elector``: :class:`~aioelect.Elector`, :class:`~aioelect.Leadership`, the keeper;
* ``_handover``: the handover note and the rule every grant passes;
* ``_health``: the health check that decides whether a candidate campaigns;
* ``_backend``: the small protocol each backend implements;
* the base: ``_config`` (validation, timing, DSNs), ``_errors``, ``_log``,
  ``_events``, ``_transitions``, ``_tasks``, ``_values``.

Backends import the protocol and the base, never ``_elector``,
``_handover`` or ``_health``.
"""
