"""A soak candidate of the shards workload: one OS process running ``aioelect.Shards`` over a set of names.

Every election of the process (its member election, each name's) is on one shared session: an
``EtcdSession`` or a ``PostgresSession``/``MySQLSession``. The work of each owned name writes to the fenced
register's row of that name every 20-50 ms, each write preceded by a read of ``current_leadership().held``;
it writes nothing while ``held`` is False. Events go to ``--events`` as JSON lines with
``time.monotonic_ns()``, as :mod:`soak.candidate` writes them, each with the ``name`` it is about:

* ``start``; ``lead`` (name, token); ``unheld`` (name, token); ``lost`` and ``released`` (name, token, reason);
* ``act`` (name, token, t0, t1, ok, error);
* ``exit`` (tasks: the asyncio tasks still alive after the session closed), on SIGTERM.

Run as ``python -m soak.shards_candidate`` by :mod:`soak.runner`; the process is :mod:`soak.candidate`'s, with
``--names``.
"""

from __future__ import annotations

from .candidate import run

if __name__ == "__main__":
    run(shards=True)
