"""aioelect's benchmark suite: aioelect against its peers, on the same throwaway servers, in one run.

``python -m bench`` (or ``make bench``) starts MariaDB, etcd and PostgreSQL
with the tests' harness (:mod:`tests.harness`), runs each implementation's candidates as
separate processes (``bench/candidates/``) through the scenarios (handovers,
faults, idle cost, handoff rate, cold start, scale to 1,000 elections per
process) beside one server round trip per backend, and writes
``bench/RESULTS.md``, ``bench/takeover.png`` and ``bench/scale.png``. The peers (tooz, etcd3gw...)
are bench-only requirements (``bench/requirements.txt``), never aioelect's.
"""
