"""One module (or package) per backend: a :class:`aioelect._backend.Backend` and the options it validates.

A backend imports only the protocol (``_backend``) and the shared utilities
of the base layer (``_config``, ``_errors``, ``_log``, ``_events``,
``_transitions``, ``_tasks``, ``_values``), besides the modules of its own
package and the helpers under ``backends/`` that contracts name. Nothing else
of aioelect: not the elector beside it (``_elector``), nor the handover
rule and health checks the core applies over every backend (``_handover``,
``_health``), nor the command line's early signals (``_early``), nor
anything above, nor another backend. The "layers", "backends-below-the-core"
and "backends-independent" contracts of pyproject.toml (``lint-imports``)
hold every module to this.
:mod:`aioelect._electors` wires each backend to an :class:`aioelect.Elector`.
"""
