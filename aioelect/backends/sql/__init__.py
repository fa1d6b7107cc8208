"""The SQL backends: one engine of session locks and its two dialects.

* ``_session_lock``: the engine (campaign, hold, release, fencing, which
  errors are permanent), over the :class:`LockSessions` it is given;
* ``_shared_lock``: a shared session, many electors' locks on one
  connection per process;
* ``_state``: the fenced state store on a SQL table;
* ``mysql`` (with ``_mysql_tls``) and ``postgres`` (with ``_postgres_tls``,
  ``_postgres_table``, ``_postgres_wire``): the dialects, their options and
  shared sessions.
"""
