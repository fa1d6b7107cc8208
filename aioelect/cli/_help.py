"""The help texts of the ``aioelect`` command line: the epilog of ``aioelect --help`` and each command's description."""

from __future__ import annotations

from ..wiring._settings import (
    ENV_ALLOW_UNSAFE_TOPOLOGY,
    ENV_ALLOW_VOLATILE_TOKENS,
    ENV_BACKEND,
    ENV_CHECK_INTERVAL,
    ENV_CHECK_TIMEOUT,
    ENV_CONNECT_TIMEOUT,
    ENV_ETCD_CA,
    ENV_ETCD_CERT,
    ENV_ETCD_DEGRADE_TO_LOCAL,
    ENV_ETCD_ENDPOINTS,
    ENV_ETCD_KEY,
    ENV_ETCD_USER,
    ENV_FENCING,
    ENV_FILE,
    ENV_FILE_MODE,
    ENV_HEALTH_URL,
    ENV_IDENTITY,
    ENV_KEY_PREFIX,
    ENV_LEASE,
    ENV_MIN_REPLICAS,
    ENV_MYSQL_DSN,
    ENV_NAME,
    ENV_PASSWORD,
    ENV_POLL_INTERVAL,
    ENV_POSTGRES_DSN,
    ENV_PRIORITY,
    ENV_REDIS_SENTINEL_PASSWORD,
    ENV_REDIS_SENTINEL_USERNAME,
    ENV_REDIS_URL,
    ENV_RENEW_DEADLINE,
    ENV_SCHEMA,
    ENV_SHARD,
    ENV_TOKEN,
)
from ._supervisor import KILL_RESERVE

__all__ = ["EPILOG", "RUN_DESCRIPTION", "SHARDS_DESCRIPTION"]

EPILOG = f"""\
backend selection:
  Give one of --etcd, --mysql, --postgres, --redis or --file. Without any,
  the environment is read like aioelect.from_env(): {ENV_ETCD_ENDPOINTS},
  {ENV_MYSQL_DSN}, {ENV_POSTGRES_DSN}, {ENV_REDIS_URL}, {ENV_FILE}, in that
  priority ({ENV_BACKEND} names one). A backend named on the command line
  replaces the environment's.

environment:
  {ENV_ETCD_ENDPOINTS:<24} comma-separated etcd endpoints (host:port or https://host:port)
  {ENV_MYSQL_DSN:<24} mysql://user@host:port/database
  {ENV_POSTGRES_DSN:<24} postgresql://user@host:port/database
  {ENV_REDIS_URL:<24} redis://user@host:port/db (rediss:// for TLS; redis+sentinel://, redis+cluster://)
  {ENV_FILE:<24} path of a lock file (one machine only)
  {ENV_NAME:<24} election name (lock name / key prefix)
  {ENV_IDENTITY:<24} this candidate's identity (default hostname:pid:random)
  {ENV_PRIORITY:<24} this candidate's priority (run --priority): a higher one is handed the leadership
  {ENV_HEALTH_URL:<24} --health-url, kept out of ps and of CMD's environment
  {ENV_PASSWORD:<24} password for the DSN's user or the etcd user; never printed
  {ENV_ETCD_USER:<24} etcd user name
  {ENV_REDIS_SENTINEL_USERNAME}
  {"":<24} Redis Sentinel: the Sentinels' own user (the URL's user is the master's)
  {ENV_REDIS_SENTINEL_PASSWORD}
  {"":<24} Redis Sentinel: the Sentinels' own password; never printed
  {ENV_ETCD_CA:<24} etcd: CA certificate (PEM) that verifies the server
  {ENV_ETCD_CERT:<24} etcd: client certificate (PEM), with {ENV_ETCD_KEY}
  {ENV_ETCD_KEY:<24} etcd: the client certificate's unencrypted key (PEM)
  {ENV_LEASE:<24} seconds a silent leader keeps the election (--lease, etcd --ttl)
  {ENV_RENEW_DEADLINE:<24} seconds a leader may go unconfirmed before it fences itself (--renew-deadline)
  {ENV_POLL_INTERVAL:<24} seconds between a follower's tries (--poll-interval)
  {ENV_CHECK_INTERVAL:<24} seconds between a leader's confirmations (--check-interval)
  {ENV_CHECK_TIMEOUT:<24} seconds one confirmation may take (--check-timeout)
  {ENV_CONNECT_TIMEOUT:<24} seconds connecting may take (--connect-timeout)
  (--renew-deadline, --check-interval, --check-timeout, --connect-timeout or a
  timing variable that means nothing to the chosen backend is logged at WARNING
  and ignored)
  {ENV_FENCING:<24} MySQL, PostgreSQL: 0 for no fencing tokens (--no-fencing)
  {ENV_SCHEMA:<24} PostgreSQL: schema of table aioelect_leaders (--schema)
  {ENV_MIN_REPLICAS:<24} Redis: replicas WAIT must confirm for each grant (--min-replicas)
  {ENV_KEY_PREFIX:<24} Redis: prefix of every key and channel (--key-prefix)
  {ENV_FILE_MODE:<24} file: lock files' mode, 600 or 660 (--file-mode)
  {ENV_ALLOW_VOLATILE_TOKENS}
  {"":<24} 1: MySQL, Redis: accept fencing tokens a server crash can hand
  {"":<24} out twice (--allow-volatile-tokens; logged at WARNING)
  {ENV_ALLOW_UNSAFE_TOPOLOGY}
  {"":<24} 1: MySQL: accept Galera or Group Replication, where two leaders
  {"":<24} can run at once (--allow-unsafe-topology; logged at WARNING)
  {ENV_ETCD_DEGRADE_TO_LOCAL}
  {"":<24} from_env() only: this command never leads without etcd (every
  {"":<24} instance would run CMD), so it is ignored, with a WARNING
  {ENV_BACKEND:<24} which backend's variable to use when several are set: etcd,
  {"":<24} mysql, postgres, redis or file (local and memory are refused: no
  {"":<24} election between processes); an option such as --redis replaces it
  (a backend variable such as {ENV_MIN_REPLICAS} that means nothing to the
  chosen backend is logged at WARNING and ignored; its flag is refused)

TLS:
  etcd        https:// endpoints, or --etcd-ca/--etcd-cert/--etcd-key (which
              imply TLS for endpoints without a scheme). Without --etcd-ca
              the system CAs verify the server.
  MySQL       in the DSN: ?ssl-ca=PATH&ssl-cert=PATH&ssl-key=PATH
              &ssl-mode=VERIFY_IDENTITY (or VERIFY_CA, REQUIRED, DISABLED)
  PostgreSQL  in the DSN: ?sslmode=verify-full&sslrootcert=PATH&sslcert=PATH
              &sslkey=PATH (libpq's names and modes)
  A certificate that is refused or not trusted exits with status 3 at once.

metrics (run):
  --metrics-port PORT serves Prometheus metrics on http://HOST:PORT/metrics
  (HOST: --metrics-host, default 127.0.0.1), e.g. aioelect_is_leader 1.0
  while this process leads; needs prometheus-client (aioelect[prometheus]).

probes (run):
  --health-port PORT serves http://HOST:PORT/healthz (200 while aioelect
  runs), /readyz (200 while the backend answers) and /leader (200 only
  while this process leads), each a JSON object with role, identity,
  leader and token (HOST: --health-host, default 127.0.0.1).
  Both servers run in aioelect's event loop: at most 32 connections each
  (fewer under a low ulimit -n), the surplus reset; a request must arrive
  within 5 s; so they never hold more descriptors than that.

exit status:
  0    success (observe: interrupted by SIGINT/SIGTERM)
  1    leader: there is no leader
  2    bad usage or configuration
  3    backend unreachable, refused (wrong password, unknown database...),
       or its driver not installed
  run: CMD's exit status; 128+N when CMD died of signal N (143: SIGTERM,
       137: SIGKILL), or when aioelect was stopped by signal N before CMD
       started; 126/127 when CMD cannot be executed / is not found;
       75 with --no-wait when another instance leads (CMD did not run;
       --conflict-exit-code N chooses another status).
"""

RUN_DESCRIPTION = f"""\
Campaign, and run CMD only while this process is the leader.

* SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to
  CMD (to its process group); aioelect then exits with CMD's status (no
  restart with --forever). Before CMD starts they stop the campaign. SIGPIPE
  is ignored (a write on a closed connection fails instead).
* CMD's tree: CMD and every process it starts, even one that calls setsid
  or double-forks (Linux: CMD runs under a small shim process, a child
  subreaper, that keeps them all its descendants).
* If leadership is lost, CMD's tree gets SIGTERM, then SIGKILL after
  --grace seconds, and the lock is released only once the tree is gone.
  --grace must end before the lock can pass to another candidate: at most
  the backend's safety margin (lease less renew deadline: 3s on MySQL,
  PostgreSQL and Redis with the default --lease, 1.67s on etcd with the
  default --ttl)
  less {KILL_RESERVE:g}s; by default half the margin.
* When CMD exits, processes of its tree still running are stopped the
  same way before the leadership is released.
* Without --forever, aioelect exits with CMD's status once CMD ends; with
  --forever it campaigns again (after --restart-delay) until interrupted.
  Long-running commands (aioelect run --forever -- celery beat) keep one
  instance running on some host: a follower waits and takes over.
* --no-wait tries once, like flock -n: when another instance leads, CMD
  does not run and aioelect exits with status 75 (--conflict-exit-code N,
  like flock -E, chooses another: 0 where 75 would count as a failure).
  Cron on several hosts then runs a job once per schedule, not once per
  host in turn.
* If aioelect itself dies otherwise (SIGKILL, the OOM killer, a crash),
  the shim SIGKILLs CMD's whole tree at once (measured on 2 busy cores:
  gone after 9 to 16 ms in the median, 84 ms at most) and holds the lock
  file or the server session until then: on the file, MySQL and PostgreSQL
  backends the lock passes on only once the tree is gone; on etcd the lease
  ends TTL seconds later. As PID 1 (in a container) aioelect reaps the
  orphans it is handed.
* Not covered: processes started through another service (systemd-run,
  at, ssh, a container runtime), a process stuck in the kernel (it dies
  when the kernel lets go; logged), a stopped (SIGSTOP) or frozen aioelect
  (the lease runs out; use the fencing token), and systems other than
  Linux (no shim: CMD runs in its process group, which setsid leaves, and
  outlives a SIGKILLed aioelect).
* CMD's environment gets {ENV_IDENTITY} (ours) and {ENV_TOKEN} (the
  fencing token of this leadership, empty if the backend has none). It does
  not get aioelect's secrets unless --pass-secret NAME: {ENV_PASSWORD},
  {ENV_MYSQL_DSN}, {ENV_POSTGRES_DSN}, {ENV_REDIS_URL}, any other
  AIOELECT_* variable whose name holds PASSWORD or ends in _DSN or _URL,
  and the database clients' variables: libpq's (PGPASSWORD, PGPASSFILE,
  PGHOST...) and those starting with MYSQL_, MARIADB_ or LIBMYSQL_
  (MYSQL_PWD...).
"""


SHARDS_DESCRIPTION = f"""\
Spread --names over the instances that run this command (same --names,
same --name), and run one CMD per name this instance owns.

* Each instance owns a balanced share: with m instances, len(names) // m
  names or one more. A name moves only when an instance joins or leaves
  (or its leadership is lost); no name is owned by two instances at once.
* CMD's environment gets {ENV_SHARD} (the name), {ENV_TOKEN} (that name's
  fencing token) and {ENV_IDENTITY} (ours); not aioelect's secrets unless
  --pass-secret NAME (as for run).
* When a name moves or its leadership is lost, its CMD's tree gets SIGTERM,
  then SIGKILL after --grace seconds, and the name is let go only once the
  tree is gone (the process-tree guarantees of run, per CMD). --grace is
  bounded by the backend's safety margin as for run.
* A CMD that exits is started again after --restart-delay while its name
  is still owned.
* SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to
  every CMD; each name is let go once its tree is gone, and aioelect exits
  with 128 + the signal. SIGPIPE is ignored.
* Runs on every backend. On etcd, MySQL and PostgreSQL every election of
  the instance is on one shared session (one etcd lease, one SQL
  connection), so its names are lost together when that session ends; on
  Redis each election has a connection of its own; on the file backend
  (one machine) each has its own lock file, --file PATH plus "." plus the
  election's name. --max-instances bounds how many instances take part.
"""
