"""The one place that wires backends to the core.

* ``_electors``: an :class:`~aioelect.Elector` over each backend
  (``MySQLElector``...), whose backend module and driver are imported when
  first used;
* ``_settings``: every ``AIOELECT_*`` variable, read into one ``Settings``;
* ``_factory``: :func:`~aioelect.new` and :func:`~aioelect.from_env`, the
  backend chosen from arguments or the environment.
"""
