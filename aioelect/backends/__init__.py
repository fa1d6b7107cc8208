"""One module (or package) per backend: a :class:`aioelect.core._backend.Backend` and the options it validates.

A backend imports only the protocol (``core._backend``) and the base layer
of the core (``_config``, ``_errors``, ``_log``, ``_events``,
``_transitions``, ``_tasks``, ``_values``), besides the modules of its own
package (``sql/``, ``etcd/``, ``redis/``, ``file/``). Nothing else of
aioelect: not the elector that drives it (``core._elector``), nor the
handover rule and health checks the core applies over every backend
(``core._handover``, ``core._health``), nor the command line's early
signals (``_early``), nor anything above, nor another backend. The
"layers", "backends-see-the-protocol" and "backends-independent" contracts
of pyproject.toml (``lint-imports``) hold every module to this.
:mod:`aioelect.wiring._electors` wires each backend to an :class:`aioelect.Elector`.
"""
