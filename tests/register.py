"""The assumptions register: every assumption the "one leader" proof rests on, how aioelect enforces it, and the
test that breaks it and shows the consequence.

docs/guarantees.md shows this list as a table between ``<!-- register:start -->`` and ``<!-- register:end -->``;
``tests/test_register.py`` fails when the two differ or when a named test does not exist, and
``python -m tests.register`` writes the table into the page.

A row whose ``breaks`` is None has no such test yet: it is rendered as **open**, and the test keeps the open rows
to the ones listed there, so that none is added without being seen.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "guarantees.md"
START, END = "<!-- register:start -->", "<!-- register:end -->"

#: How an assumption is enforced, from strongest to weakest.
REFUSED = "refused at connect or campaign"
RENEW = "checked on every renew"
CHECKED = "checked where it is used"
DOCUMENTED = "documented"


@dataclass(frozen=True)
class Assumption:
    scope: str
    kind: str
    text: str
    enforced: str
    how: str
    breaks: str | None  # "tests/test_x.py::test_name": the test that breaks the assumption and shows what happens
    #: Randomised runs that also break it, among other faults (adversary seeds, soak workloads): "path::name[id]".
    also: tuple[str, ...] = ()


REGISTER: tuple[Assumption, ...] = (
    # --- every backend: the elector core -------------------------------------------------------------
    Assumption(
        "every backend",
        "process state",
        "a leader paused (SIGSTOP, a pause of its runtime, a blocked loop) looks at its deadline before it acts again",
        CHECKED,
        "`held`/`check()` compare the monotonic clock with the renew deadline; the keeper fences at it",
        "tests/test_faults_mysql.py::test_leader_frozen_longer_than_lease",
    ),
    Assumption(
        "every backend",
        "process state",
        "the leader's event loop is never blocked for longer than `renew_deadline` less the age of its last "
        "confirmation and one round trip (half the lease or more at the defaults), or it loses its leadership",
        CHECKED,
        "confirmations dated from their send; `held` is judged on waking; the loop's lag is measured "
        "and a block that cost or nearly cost the leadership is named in a WARNING",
        "tests/test_blocked_loop.py::test_a_block_longer_than_the_lease_loses_it_without_overlap",
    ),
    Assumption(
        "every backend",
        "process state",
        "the leader's work stops when its task is cancelled",
        CHECKED,
        "the work runs in the acquiring task, cancelled at a loss; a release waits for it",
        "tests/test_elector.py::test_release_waits_for_work_that_ignores_cancellation",
    ),
    Assumption(
        "every backend",
        "process state",
        "a cancellation of the acquiring task is never swallowed by a driver (asyncio.wait_for before 3.12)",
        CHECKED,
        "each campaign step runs in a task of its own; a hold won meanwhile is released",
        "tests/test_redis.py::test_a_campaign_cancelled_as_its_grant_arrives_is_cancelled_and_leaves_no_key",
    ),
    Assumption(
        "every backend",
        "clock",
        "the leader's monotonic clock runs no slower than the server's clock that ends its lease or session",
        DOCUMENTED,
        "the margin `lease - renew_deadline` absorbs rate differences; no check: a cut-off Redis "
        "leader whose clock runs at 0.4x leads about 2 s beside its successor (at 0.8x, inside the margin, none)",
        "tests/test_faults_clock.py::test_a_leader_whose_monotonic_clock_runs_slow_leads_past_its_key_when_the_margin_is_exceeded",
    ),
    Assumption(
        "every backend",
        "process state",
        "a write already sent when the leader pauses past its deadline is refused only by a resource that "
        "checks the token",
        DOCUMENTED,
        "tokens on every backend; the check is the resource's: two writes a leader sent into a "
        "stalled link land after its successor's, the plain one over it, the token-checked one changing nothing",
        "tests/test_faults_partition.py::test_a_write_sent_before_the_leader_is_cut_off_lands_after_its_successor_refused_only_by_the_token",
    ),
    # --- MySQL / MariaDB --------------------------------------------------------------------------------
    Assumption(
        "MySQL / MariaDB",
        "server setting",
        "the server does not end a quiet lock session before `lease` (`wait_timeout`, net and keepalive timeouts)",
        REFUSED,
        "sets `wait_timeout`, raises the net timeouts, reads the keepalive, refuses a shorter one",
        "tests/test_mysql.py::test_server_keepalives_shorter_than_the_lease_are_refused_at_connect",
    ),
    Assumption(
        "MySQL / MariaDB",
        "topology",
        "a lock is held by one session of one server (not a Galera cluster, where each node has its own locks)",
        REFUSED,
        "a Galera node is refused unless allowed by name",
        "tests/test_mysql.py::test_galera_node_is_refused_unless_allowed",
    ),
    Assumption(
        "MySQL / MariaDB",
        "server forgets",
        "a session KILLed by our cleanup is ours, whatever id a restarted server hands out",
        CHECKED,
        "the session's own marker lock (`IS_USED_LOCK`), checked on the connection that KILLs; else only "
        "our socket is closed",
        "tests/test_mysql.py::test_a_lost_request_after_a_fast_restart_never_kills_the_session_given_its_id",
    ),
    Assumption(
        "MySQL / MariaDB",
        "server forgets",
        "a token survives a server crash (InnoDB, the log flushed at commit)",
        REFUSED,
        "refused when asked for, warned of otherwise",
        "tests/test_mysql.py::test_tokens_that_may_not_survive_a_crash_are_refused_when_asked_for_and_warned_of_otherwise",
    ),
    Assumption(
        "MySQL / MariaDB",
        "network path",
        "a leader cut off from the server stops before the server ends its session",
        RENEW,
        "stops within `check_interval + 2 x check_timeout` of its last answered check",
        "tests/test_faults_partition.py::test_network_partition_between_leader_and_server",
    ),
    Assumption(
        "MySQL / MariaDB",
        "operator",
        "a KILLed lock session is a loss seen at once",
        RENEW,
        "the closed connection ends the leadership",
        "tests/test_mysql.py::test_killed_session_is_noticed_at_once",
    ),
    # --- PostgreSQL -------------------------------------------------------------------------------------
    Assumption(
        "PostgreSQL",
        "server setting",
        "the server does not end a quiet lock session before `lease` (idle timeouts, TCP keepalives)",
        REFUSED,
        "sets them on the session, reads the rest, refuses a shorter one",
        "tests/test_postgres.py::test_a_server_bound_shorter_than_the_lease_is_refused_at_connect",
    ),
    Assumption(
        "PostgreSQL",
        "topology",
        "the lock session is one server session, not lent per transaction by a pooler",
        REFUSED,
        "a probe's advisory lock must be seen held and then free, every statement in the session's own "
        "backend: a transaction-mode pooler is refused every time",
        "tests/test_postgres.py::test_a_transaction_pool_under_load_never_lets_a_candidate_lead",
    ),
    Assumption(
        "PostgreSQL",
        "server forgets",
        "a backend terminated by our cleanup is ours",
        CHECKED,
        "pid and `backend_start` recorded at connect",
        "tests/test_postgres.py::test_a_session_is_terminated_only_when_its_pid_and_start_are_the_ones_recorded",
    ),
    Assumption(
        "PostgreSQL",
        "network path",
        "a paused leader cut off by the network is not replaced before it has stopped",
        REFUSED,
        "keepalives set so that the server ends the session after `lease`, never before",
        "tests/test_faults_keepalive.py::test_a_paused_leader_cut_off_by_the_network_never_leads_beside_its_successor",
    ),
    Assumption(
        "PostgreSQL",
        "server forgets",
        "a token survives a server crash",
        CHECKED,
        "a sequence in a table written before the leadership is reported",
        "tests/test_security_postgres.py::test_tokens_grow_across_a_server_crash",
    ),
    Assumption(
        "PostgreSQL",
        "operator",
        "a terminated lock session is a loss seen at once",
        RENEW,
        "the closed connection ends the leadership",
        "tests/test_postgres.py::test_terminated_session_is_noticed_at_once",
    ),
    Assumption(
        "MySQL / MariaDB, PostgreSQL",
        "process state",
        "when a shared session closes its connection (a statement failed or cut off, a release not answered), every "
        "leadership on it ends before another candidate can take a lock the server freed with it",
        CHECKED,
        "closing the connection wakes the monitor of every hold on it, which reports the loss at once",
        "tests/test_sql_shared.py::test_a_statement_that_closes_the_connection_loses_every_leadership_at_once",
    ),
    Assumption(
        "PostgreSQL",
        "operator",
        "a terminated lock session, its own or shared, is lost before a waiting candidate can lead: the server sends "
        "its FATAL message before it frees the session's locks",
        CHECKED,
        "the FATAL message is read off the wire as it arrives (asyncpg reports only the socket's close, "
        "after the locks are free) and wakes the monitor of every hold on the session",
        "tests/test_postgres.py::test_a_terminated_leader_is_lost_before_a_waiting_candidate_leads",
    ),
    Assumption(
        "MySQL / MariaDB, PostgreSQL",
        "operator",
        "a shared session ended by the server (KILL, pg_terminate_backend) is lost by every leadership on it before "
        "a candidate elsewhere leads; MariaDB closes a KILLed session's socket before it frees its locks",
        CHECKED,
        "the transport's end of stream (MySQL) or the FATAL message (PostgreSQL), seen between statements, "
        "wakes the monitor of every hold on it",
        "tests/test_sql_shared.py::test_a_shared_session_ended_by_the_server_loses_every_leadership_at_once",
    ),
    # --- etcd ---------------------------------------------------------------------------------------------
    Assumption(
        "etcd",
        "server setting",
        "the lease lives its TTL after the last acknowledged keep-alive, and that TTL is the one asked for",
        REFUSED,
        "a shorter grant is refused and revoked",
        "tests/test_etcd.py::test_a_lease_granted_shorter_than_asked_is_refused_and_revoked",
    ),
    Assumption(
        "etcd",
        "topology",
        "a quorum of members answers; losing one member of three changes nothing",
        CHECKED,
        "requests are linearizable; keep-alives move to another endpoint",
        "tests/test_etcd_faults.py::test_cluster_member_killed_election_goes_on",
    ),
    Assumption(
        "etcd",
        "topology",
        "whichever member of three dies (etcd's raft leader included), a waiting candidate campaigns on through "
        "another; a leader whose keep-alives wait out the members' election may fence itself, never lead past it",
        CHECKED,
        "keep-alives and watches move to another endpoint; a won campaign renews its lease before it "
        "leads, so no leadership is returned past its renew deadline",
        "tests/test_etcd_member_loss.py::test_waiting_candidate_campaigns_on_after_any_member_dies",
    ),
    Assumption(
        "etcd",
        "server frozen",
        "a leader whose keep-alives go unanswered fences itself before its lease can expire",
        RENEW,
        "renew deadline from the send time of the last acknowledged keep-alive",
        "tests/test_etcd_faults.py::test_frozen_etcd_leader_fences_itself_within_renew_deadline",
    ),
    Assumption(
        "etcd",
        "operator",
        "a revoked lease or a deleted key is a loss seen at once",
        RENEW,
        "the leader watches its own key",
        "tests/test_etcd_faults.py::test_lease_revoked_from_outside_is_lost_at_once",
    ),
    Assumption(
        "etcd",
        "network path",
        "a leader cut off from etcd stops and is replaced, and never leads locally once it has reached etcd",
        RENEW,
        "renew deadline; `degrade_to_local` only before etcd was ever reached",
        "tests/test_etcd_faults.py::test_cut_off_leader_never_leads_locally_one_leader_after_heal",
    ),
    Assumption(
        "etcd",
        "topology",
        "a member cut off from the others while a client still reaches it answers no linearizable request; as "
        "etcd's raft leader it still renews leases until it sees that it lost its quorum (a keep-alive is not "
        "linearizable), and the others' new raft leader extends every lease by `ttl` plus an election timeout",
        DOCUMENTED,
        "etcd's own guarantees; aioelect sends no serializable request: the leader on a cut-off raft "
        "leader is confirmed past the cut, fences, and the candidate on the other two leads after it; only a "
        "serializable read is answered there, from the member's stale view",
        "tests/test_etcd_partition.py::test_a_member_cut_off_from_the_others_answers_no_linearizable_request_and_its_leader_fences",
        also=(
            "tests/test_adversary.py::test_adversary_seeds_find_no_violation[etcd-cluster]",
            "tests/test_soak.py::test_short_splits_soak_passes",
        ),
    ),
    Assumption(
        "etcd",
        "server version",
        "a request its client gives up on (a timeout, a cancelled campaign) never takes the server down; etcd "
        "3.5.0 to 3.5.4 panic when the client of a read-only transaction goes away while it is applied "
        "(etcd-io/etcd#14110, fixed in 3.5.5), so that one cancelled read stops a member",
        CHECKED,
        "aioelect sends no read-only transaction: a campaign's check is one or two Range reads at one revision; "
        "every transaction it sends writes (campaign, resign, fenced state)",
        "tests/test_etcd_faults.py::test_candidacy_checks_cancelled_mid_flight_leave_etcd_running",
    ),
    # --- Redis (one master) ------------------------------------------------------------------------------
    Assumption(
        "Redis",
        "server setting",
        "the key and the token survive a restart (append-only file, fsync always)",
        REFUSED,
        "refused unless `volatile_tokens=True`",
        "tests/test_redis.py::test_a_server_that_can_lose_a_token_is_refused_unless_volatile_tokens",
    ),
    Assumption(
        "Redis",
        "server setting",
        "the key is never evicted, and no connection is closed between two renews",
        REFUSED,
        "`maxmemory-policy` and `timeout` read and refused",
        "tests/test_redis_errors.py::test_a_server_timeout_shorter_than_the_renews_is_refused_naming_it",
    ),
    Assumption(
        "Redis",
        "permission",
        "the user may run `ROLE`, which every campaign try and every renew send",
        REFUSED,
        "a denied `ROLE` is a `PermanentBackendError` at the first campaign try",
        "tests/test_redis.py::test_an_acl_user_denied_role_is_refused_at_the_campaign",
    ),
    Assumption(
        "Redis",
        "operator",
        "nobody else deletes or overwrites the key",
        RENEW,
        "each renew compares the key's value",
        "tests/test_redis.py::test_key_deleted_or_changed_by_an_operator_is_a_loss_seen_within_check_interval",
    ),
    Assumption(
        "Redis",
        "clock",
        "the server's wall clock is not stepped forward by more than the margin",
        DOCUMENTED,
        "the key's expiry is the server's wall clock; no check: after a step of 2.9 s (margin 1 s) a "
        "cut-off leader acts 1.7 s past its key's expiry, when any candidate that asks leads beside it (one "
        "already waiting sleeps to the expiry it read before the step); a step of 0.5 s, never",
        "tests/test_faults_clock.py::test_a_redis_server_clock_stepped_forward_past_the_margin_expires_a_leaders_key_while_it_leads",
    ),
    Assumption(
        "Redis",
        "server forgets",
        "a restart without persistence is a loss, never a second leader with the same key",
        RENEW,
        "the leader's next renew finds no key",
        "tests/test_redis.py::test_restart_without_aof_is_a_loss_and_with_aof_keeps_the_leadership",
    ),
    # --- Redis Sentinel and Cluster -------------------------------------------------------------------
    Assumption(
        "Redis Sentinel",
        "topology",
        "with `min_replicas=N`, a failover keeps the key and the token: every grant is on every replica the master "
        "knows of, and on at least N",
        CHECKED,
        "a grant stands only once `WAIT` counts every replica `ROLE` or `INFO replication` lists, and at least N",
        "tests/test_redis_sentinel.py::test_failover_with_min_replicas_keeps_the_token_growing",
    ),
    Assumption(
        "Redis Sentinel",
        "topology",
        "a replica still in its first full sync (which `ROLE` leaves out, and Sentinel may promote: a higher "
        "priority, an operator's `SENTINEL FAILOVER`) never becomes master while a leader's last confirmed write is "
        "not on it",
        RENEW,
        "`INFO replication` lists it in every state and `WAIT` must count it, which it cannot before it is in sync: "
        "the leader's renews stop counting, and it fences at its renew deadline, while a replica syncs (the price: "
        "no leader from a replica's attach until its sync ends plus a grant)",
        "tests/test_redis_split.py::test_a_replica_still_in_its_first_sync_fences_the_leader_before_it_can_be_promoted",
    ),
    Assumption(
        "Redis Sentinel",
        "topology",
        "the URL lists the whole sentinel group, so that a majority of those listed includes a sentinel that took "
        "part in any failover; with one sentinel listed, that one decides",
        CHECKED,
        "a grant stands, and a leader's renews count, only while a majority of the listed sentinels "
        "(`len // 2 + 1`) answer and name the master, none holding it down; fewer answers: the grant is withdrawn "
        "and retried, the leader fences at its renew deadline",
        "tests/test_redis_split.py::test_a_minority_sentinel_that_still_names_the_old_master_confirms_no_grant",
    ),
    Assumption(
        "Redis Sentinel",
        "topology",
        "a failover promotes only a replica that was connected to the master at the leader's last confirmed write "
        "(Sentinel skips one disconnected for more than ten `down-after-milliseconds`, a Cluster one older than "
        "its `cluster-replica-validity-factor`; a replica chosen by hand is not checked)",
        DOCUMENTED,
        "a replica that leaves the master ends the leadership at its renew deadline; a grant through Sentinel stands "
        "only once a majority of the listed sentinels, asked after its `WAIT`, name the master, none holding it down",
        "tests/test_redis_split.py::test_a_replica_promoted_by_hand_after_it_left_the_master_elects_a_second_leader",
        also=("tests/test_soak.py::test_short_splits_soak_passes",),
    ),
    Assumption(
        "Redis Sentinel",
        "topology",
        "without `min_replicas`, a failover can lose a grant and send the token back",
        DOCUMENTED,
        "the default says what it gives up",
        "tests/test_redis_sentinel.py::test_without_min_replicas_a_failover_can_send_the_token_back",
    ),
    Assumption(
        "Redis Sentinel",
        "network path",
        "with `min_replicas` ≥ 1, a master cut off from the sentinels while the leader still reaches it stops "
        "confirming the old leader before the promoted replica's copy of the key expires",
        RENEW,
        "each renew is sent with `WAIT`, `ROLE` and `INFO replication` in one round trip and counts only when every "
        "replica the master knows of (at least `min_replicas`) has it, none of the previous confirmation's replicas "
        "left, and the server is a master; a majority of the listed sentinels, asked once per `check_interval`, must "
        "name this master; "
        "`min_replicas=0` through Sentinel logs a WARNING",
        "tests/test_redis_split.py::test_without_min_replicas_a_cut_off_master_keeps_its_leader_beside_the_new_one",
        also=(
            "tests/test_adversary.py::test_adversary_seeds_find_no_violation[redis-sentinel]",
            "tests/test_soak.py::test_short_splits_soak_passes",
        ),
    ),
    Assumption(
        "Redis Cluster",
        "topology",
        "a failover of the slot's master with `min_replicas` keeps the key and the token",
        CHECKED,
        "`WAIT` on the slot's master; candidates follow the slot",
        "tests/test_redis_cluster.py::test_a_failover_of_the_slots_master_with_min_replicas_keeps_the_token_growing",
        also=("tests/test_adversary.py::test_adversary_seeds_find_no_violation[redis-cluster]",),
    ),
    Assumption(
        "Redis Cluster",
        "network path",
        "with `min_replicas` ≥ 1, a master cut off from the cluster bus while clients reach it stops confirming the "
        "old leader before the promoted replica's copy of the key expires",
        RENEW,
        "the renew checks of Redis Sentinel (`WAIT` on every replica of the slot's master, `ROLE`)",
        "tests/test_redis_cluster.py::test_a_master_cut_off_from_the_cluster_bus_stops_its_leader_before_a_successor_leads",
        also=("tests/test_adversary.py::test_adversary_seeds_find_no_violation[redis-cluster]",),
    ),
    # --- file ---------------------------------------------------------------------------------------------
    Assumption(
        "file",
        "topology",
        "every candidate runs on one host and locks one local file (`flock`), not over a network filesystem",
        DOCUMENTED,
        "a frozen leader keeps the lock: there is no lease",
        "tests/test_file.py::test_frozen_leader_keeps_the_lock",
    ),
    Assumption(
        "file",
        "operator",
        "nobody deletes the lock file",
        RENEW,
        "the leader's check compares the file it locked with the path",
        "tests/test_file.py::test_deleting_the_lock_file_is_a_loss",
    ),
    # --- the supervisor (`aioelect run`, `aioelect shards`) ---------------------------------------------
    Assumption(
        "supervisor",
        "OS",
        "every process of CMD's tree is found, whatever session or process group it made, however it forked",
        CHECKED,
        "the tree runs in a cgroup v2 of its own and under the shim, a child subreaper; the supervisor "
        "walks both (and what a dead shim left it) and lets the lock go only once none is alive",
        "tests/test_cli_supervisor.py::test_setsid_and_double_forked_descendants_are_ended_before_the_release",
    ),
    Assumption(
        "supervisor",
        "OS",
        "the kernel hands an orphan of CMD's tree to the nearest living child subreaper above it "
        "(`PR_SET_CHILD_SUBREAPER`, Linux 3.4+): the shim, else aioelect, never a process outside the tree",
        CHECKED,
        "both set it before CMD starts; a shim killed by anyone leaves the rest of the tree to aioelect, "
        "which kills and reaps it before the release",
        "tests/test_cli_supervisor.py::test_setsid_and_double_forked_descendants_are_ended_before_the_release",
    ),
    Assumption(
        "supervisor",
        "OS",
        "cgroup v2 is mounted and writable here (containment that no fork, session or stop escapes, ended at "
        "once with `cgroup.kill`, Linux 5.14+)",
        CHECKED,
        "tried at every CMD start; INFO names the containment, WARNING says when only the subreaper "
        "is left; without it each process found in /proc is killed until none is alive",
        "tests/test_cli_supervisor.py::test_a_cmd_that_stops_its_shim_is_gone_before_the_next_leaders_cmd_starts",
    ),
    Assumption(
        "supervisor",
        "operator",
        "a process of CMD's tree leaves its cgroup only by a write to `cgroup.procs` (root, or a delegated user)",
        CHECKED,
        "such a process is still the shim's descendant: the subreaper walk finds and kills it",
        "tests/test_cli_supervisor.py::test_a_cmd_that_stops_its_shim_is_gone_before_the_next_leaders_cmd_starts",
    ),
    Assumption(
        "supervisor",
        "process state",
        "a CMD that stops (SIGSTOP) or traces its own shim or a descendant still ends before the lock goes",
        CHECKED,
        "the tree is found without the shim's help; stopped processes get SIGCONT after SIGTERM, "
        "everything (the shim included) SIGKILL after the grace, which ends stopped and traced processes alike",
        "tests/test_cli_supervisor.py::test_a_cmd_that_stops_its_shim_is_gone_before_the_next_leaders_cmd_starts",
    ),
    Assumption(
        "supervisor",
        "process state",
        "aioelect itself is not stopped (SIGSTOP) or frozen past the lease while CMD runs: a stopped aioelect "
        "stops nothing, so on the server backends the lease runs out while CMD's tree works on",
        DOCUMENTED,
        "CMD gets the leadership's fencing token (`AIOELECT_TOKEN`) for the resources it writes to; "
        "woken, aioelect sees the loss and ends the tree before it exits",
        "tests/test_adversary.py::test_a_stopped_supervisor_stops_nothing_its_cmd_works_on_beside_the_next_leaders",
    ),
    Assumption(
        "supervisor",
        "process state",
        "a zombie holds no descriptor, so the lock may go while one is left (a tracer's to reap, or CMD's under "
        "a stopped shim)",
        CHECKED,
        "zombies are not waited for (cgroup `populated 0`, /proc state Z and no live thread; unreaped "
        "children of a dead shim only once the same twice in a row); CMD's status is read from "
        "its zombie",
        "tests/test_cli_supervisor.py::test_a_cmd_that_stops_its_shim_is_gone_before_the_next_leaders_cmd_starts",
    ),
    Assumption(
        "supervisor",
        "process state",
        "a process whose /proc state is Z is gone only if none of its threads runs (a main thread that ended "
        "alone with SYS_exit leaves the others running)",
        CHECKED,
        "a process is alive while any thread in /proc/PID/task is not Z, and is signalled through its "
        "live threads; CMD with a live thread is not taken for exited",
        "tests/test_cli_supervisor.py::test_a_hiding_process_of_cmds_tree_is_gone_before_the_next_leaders_cmd_starts",
    ),
    Assumption(
        "supervisor",
        "OS",
        "a process that forks and lets its parent exit again and again, every pid gone before /proc is read, "
        "always leaves a child to the nearest subreaper and stays in the process group of its session",
        CHECKED,
        "the shim ends (and lets the lock go) only once waitpid says no child is left, aioelect only "
        "once no child a dead shim left is unreaped; both SIGKILL the groups of sessions started in the tree",
        "tests/test_cli_supervisor.py::test_a_hiding_process_is_gone_before_the_lock_of_a_sigkilled_supervisor_passes_on",
    ),
    Assumption(
        "supervisor",
        "process state",
        "a process of CMD's tree in uninterruptible sleep (D) ends once SIGKILLed, within the safety margin",
        DOCUMENTED,
        "the lock is kept and SIGKILL repeated for as long as it lives, an error logged every 2 s; "
        "on etcd and Redis the lease may still expire meanwhile, and the next leader's CMD starts beside it",
        "tests/test_cli_supervisor.py::test_a_process_in_uninterruptible_sleep_keeps_the_lock_until_it_ends_but_not_a_lease",
    ),
    Assumption(
        "supervisor",
        "process state",
        "a supervisor SIGKILLed takes CMD's tree with it before its lock passes on",
        CHECKED,
        "the shim's death signal; the server keeps the lock until the shim's descriptors close",
        "tests/test_cli_supervisor.py::test_the_lock_of_a_sigkilled_supervisor_passes_on_only_once_cmds_tree_is_gone",
    ),
    Assumption(
        "supervisor",
        "OS",
        "orphans are reaped when aioelect runs as PID 1",
        CHECKED,
        "aioelect reaps every child it is given",
        "tests/test_cli_supervisor.py::test_as_pid_1_orphans_are_reaped",
    ),
    Assumption(
        "supervisor",
        "OS",
        "a stop signal sent to aioelect as PID 1 is seen, even while it starts (the kernel drops a signal sent to "
        "a PID namespace's init that has no handler for it)",
        CHECKED,
        "python -m aioelect and the aioelect script record the stop signals before importing the rest of "
        "the package; the command takes them once its handlers are in place, before CMD can start",
        "tests/test_cli_supervisor.py::test_as_pid_1_a_sigterm_during_startup_stops_it_before_cmd_starts",
    ),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The register as the Markdown table docs/guarantees.md shows."""
    lines = [
        "| scope | kind | assumption | enforced | how | the test that breaks it |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in REGISTER:
        test = f"`{row.breaks}`" if row.breaks else "**open**"
        if row.also:
            test += "; under random faults also " + ", ".join(f"`{t}`" for t in row.also)
        cells = (row.scope, row.kind, row.text, row.enforced, row.how, test)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def page_table(text: str) -> str:
    """The table between the markers of docs/guarantees.md."""
    match = re.search(re.escape(START) + r"\n(.*?)" + re.escape(END), text, re.DOTALL)
    if match is None:
        raise ValueError(f"{PAGE} has no {START} ... {END} section")
    return match.group(1).rstrip("\n")


def write() -> None:
    text = PAGE.read_text()
    start, end = text.index(START) + len(START), text.index(END)
    PAGE.write_text(text[:start] + "\n" + render() + "\n" + text[end:])


if __name__ == "__main__":
    write()
    sys.stdout.write(f"wrote the register ({len(REGISTER)} rows) into {PAGE.relative_to(ROOT)}\n")
