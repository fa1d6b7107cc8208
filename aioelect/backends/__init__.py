"""One module (or package) per backend: a :class:`aioelect._backend.Backend` and the options it validates.

A backend imports only the protocol (``_backend``) and the base layer below
it (``_config``, ``_errors``, ``_log``, ``_events``, ``_transitions``,
``_tasks``, ``_values``): never the elector beside it or anything above, and
never another backend. The "layers" and "backends-independent" contracts of
pyproject.toml (``lint-imports``) hold every module to this.
:mod:`aioelect._electors` wires each backend to an :class:`aioelect.Elector`.
"""
