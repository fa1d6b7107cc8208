"""One module (or package) per backend: a :class:`aioelect._backend.Backend` and the options it validates.

A backend imports only the protocol and the base modules (``_backend``,
``_config``, ``_errors``, ``_log``, ``_events``): never the elector layer
above it, and never another backend. :mod:`aioelect._electors` wires each
one to an :class:`aioelect.Elector`.
"""
