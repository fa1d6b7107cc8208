"""The options each backend runs with in the soak, and the bounds the checker derives from them.

Every bound is stated as ``anchor + seconds``: the fault's start (the leader
is taken away at once) or its heal (nothing can lead before the fault ends).
``SLACK`` covers scheduling on a small shared machine (four backends, their
servers and a dozen candidate processes on two cores) and the start of a
fresh candidate process.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aioelect

# The old libraries scripts/adversary-old.sh runs the adversary against keep their core at the package's root. Which
# layout is asked of the package imported, not of the import system: an editable install of this checkout would
# find its own aioelect.core for an old package that has none.
if (Path(aioelect.__file__).parent / "core").is_dir():
    from aioelect.core._config import confirmation_gap
else:
    from aioelect._config import confirmation_gap  # type: ignore[no-redef]

__all__ = [
    "ELECTION_LABELS",
    "SHARDS_LABELS",
    "SHARD_NAMES",
    "SLACK",
    "SPLIT_LABELS",
    "TIMINGS",
    "Timing",
    "confirmation_gap",
]

#: Seconds added to every leaderless bound and, in part, to the overlap margin: scheduling, not the library.
SLACK = 2.0
#: Seconds of scheduling added to the documented overlap margin.
OVERLAP_SLACK = 0.5

# Session locks (MySQL, PostgreSQL): the fault suite's timings.
_LEASE = 3
_CHECK_INTERVAL = 0.3
_CHECK_TIMEOUT = 0.6
_RENEW_DEADLINE = 2.0
_POLL = 1.0
#: The session-lock engine's reconnect backoff tops out at max(poll_interval, 1 s).
_SQL_BACKOFF = max(_POLL, 1.0)

_TTL = 3
#: etcd expires leases on a timer of its own (about every 500 ms) and renews all leases on restart or leader change.
_ETCD_EXPIRY = 1.0
#: The etcd backend's reconnect backoff tops out at 2 s; a three-member cluster elects a raft leader in about 1-2 s.
_ETCD_BACKOFF = 2.0
_RAFT_ELECTION = 2.0
#: Seconds a sentinel takes, once it reaches a demoted master again, to make it a replica of the promoted one.
_SENTINEL_RECONFIGURE = 10.0


@dataclass(frozen=True)
class Timing:
    """One backend's elector options, overlap margin and per-fault leaderless bounds (seconds)."""

    options: dict[str, Any]
    #: Two candidates may both act for this long: the documented bound for a deposed leader to notice.
    margin: float
    #: With no fault in force, nobody leads for at most this long.
    base_gap: float
    #: kind -> (anchor, seconds): the leaderless time must end by anchor + seconds.
    bounds: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: How long a frozen candidate stays frozen at least: past the lease, so that the server hands on.
    lease: float = 0.0

    def deadline(self, kind: str, start: float, heal: float) -> float:
        """When leaderless time caused by a fault of ``kind`` (``start``..``heal``) must have ended."""
        anchor, seconds = self.bounds[kind]
        return (start if anchor == "start" else heal) + seconds

    def describe(self) -> list[tuple[str, str, str]]:
        """(fault, anchor, seconds) rows for the report."""
        return [(kind, anchor, f"{seconds:.1f}") for kind, (anchor, seconds) in sorted(self.bounds.items())]


def _sql() -> Timing:
    takeover = _POLL + SLACK  # a waiting follower is granted the freed lock within one poll
    expiry = _LEASE + _POLL + SLACK  # the server ends a silent session after lease
    return Timing(
        options={
            "lease": _LEASE,
            "check_interval": _CHECK_INTERVAL,
            "check_timeout": _CHECK_TIMEOUT,
            "renew_deadline": _RENEW_DEADLINE,
            "poll_interval": _POLL,
            "fencing": True,
        },
        # A deposed leader stops within check_interval + 2 * check_timeout (LockTiming.deposed_within).
        margin=confirmation_gap(_CHECK_INTERVAL, _CHECK_TIMEOUT) + OVERLAP_SLACK,
        base_gap=takeover,
        bounds={
            "kill": ("start", takeover),
            "pause": ("start", expiry),
            "depose": ("start", takeover),
            "partition-drop": ("start", takeover),
            "partition-stall": ("start", expiry),
            "restart": ("heal", _SQL_BACKOFF + _POLL + SLACK),
            "slow": ("heal", expiry),
        },
        lease=_LEASE,
    )


def _redis() -> Timing:
    # Nobody deletes a lost leader's key: it expires lease after the send of its last renew; a waiter reads it
    # again when it can have expired and tries then (at once when a release is published). poll_interval is kept
    # in the bound: a waiter reads a key without an expiry every poll_interval.
    expiry = _LEASE + _POLL + SLACK
    return Timing(
        options={
            "lease": _LEASE,
            "check_interval": _CHECK_INTERVAL,
            "check_timeout": _CHECK_TIMEOUT,
            "renew_deadline": _RENEW_DEADLINE,
            "poll_interval": _POLL,
        },
        # docs/backends.md: a deposed leader (key deleted) stops within check_interval + 2 * check_timeout.
        margin=confirmation_gap(_CHECK_INTERVAL, _CHECK_TIMEOUT) + OVERLAP_SLACK,
        base_gap=_POLL + SLACK,
        bounds={
            "kill": ("start", expiry),
            "pause": ("start", expiry),
            "depose": ("start", _POLL + SLACK),
            "partition-drop": ("start", expiry),
            "partition-stall": ("start", expiry),
            # The key and its expiry survive in the append-only file; the campaign's backoff tops out at 1 s.
            "restart": ("heal", 1.0 + expiry),
            "slow": ("heal", expiry),
        },
        lease=_LEASE,
    )


def _etcd() -> Timing:
    expiry = _TTL + _ETCD_EXPIRY + SLACK  # a lost leader's key goes with its lease, ttl after the last keep-alive
    return Timing(
        options={"ttl": _TTL},
        # A revoked lease or deleted key reaches the leader by its watch, at the latest by its next keep-alive.
        margin=_TTL / 3 + OVERLAP_SLACK,
        base_gap=1.0 + SLACK,
        bounds={
            "kill": ("start", expiry),
            "pause": ("start", expiry),
            "depose": ("start", 1.0 + SLACK),
            "partition-drop": ("start", expiry),
            "partition-stall": ("start", expiry),
            # Leases survive a restart with their full ttl: the leader keeps it or it expires ttl later.
            "restart": ("heal", _ETCD_BACKOFF + _TTL + _ETCD_EXPIRY + SLACK),
            "member": ("start", _RAFT_ELECTION + _ETCD_BACKOFF + expiry),
            "slow": ("heal", expiry),
        },
        lease=_TTL,
    )


def _sentinel_split() -> Timing:
    """Redis under Sentinel with ``min_replicas=1``: a leader's renews count only once a replica has them, so a
    master cut off from the sentinels or its replicas confirms nothing once it has no replica left."""
    timing = _redis()
    expiry = _LEASE + _POLL + SLACK
    return replace(
        timing,
        options={**timing.options, "min_replicas": 1},
        bounds={
            **{k: timing.bounds[k] for k in ("kill", "pause", "depose")},
            # After the heal the sentinels turn the old master into a replica of the promoted one (a few seconds,
            # _SENTINEL_RECONFIGURE) and candidates still on it ask the sentinels again; the leader's copy of its
            # key on the promoted node expires lease after its last confirmed renew.
            "cut-sentinels": ("heal", _SENTINEL_RECONFIGURE + expiry),
            # No WAIT is answered while the cut lasts: nobody can be granted; after it, the key expires or is kept.
            "cut-replicas": ("heal", expiry),
            # A master restarted several times may be failed over meanwhile (as cut-sentinels), or come back with
            # the key it persisted (appendfsync always), kept by the leader or expiring lease after its last renew.
            "crash-loop": ("heal", _SENTINEL_RECONFIGURE + expiry),
        },
    )


def _etcd_split() -> Timing:
    timing = _etcd()
    expiry = _TTL + _ETCD_EXPIRY + SLACK
    return replace(
        timing,
        bounds={
            **{k: timing.bounds[k] for k in ("kill", "pause", "depose", "partition-drop", "partition-stall")},
            # The majority elects a raft leader of its own, which renews every lease; a candidate connected to the
            # isolated member reconnects (backoff) to reach a member that answers. At the heal the isolated member,
            # its term raised by its own campaigns (etcd 3.4 runs without --pre-vote), can force a second election,
            # long enough for the leader to miss its renew deadline: its lease is then renewed and expires after it.
            "isolate": ("heal", 2 * _RAFT_ELECTION + _ETCD_BACKOFF + expiry),
            # The raft leader's member restarted several times: an election each time it is lost, and the
            # candidates connected to it reconnect (backoff) to a member that answers.
            "crash-loop": ("heal", 2 * _RAFT_ELECTION + _ETCD_BACKOFF + expiry),
        },
    )


def _shards(timing: Timing) -> Timing:
    """The shards workload on a shared session: the same options (the session's), and a bound for ``join``
    (a fresh candidate starts: names move to it through their elections)."""
    return replace(timing, bounds={**timing.bounds, "join": ("start", timing.base_gap)})


#: The backends of a soak, by label: (aioelect backend, timing).
TIMINGS: dict[str, tuple[str, Timing]] = {
    "mariadb": ("mysql", _sql()),
    "postgres": ("postgres", _sql()),
    "redis": ("redis", _redis()),
    "etcd1": ("etcd", _etcd()),
    "etcd3": ("etcd", _etcd()),
    # The shards workload: aioelect.Shards over SHARD_NAMES on one shared session per candidate.
    "shards-etcd": ("etcd", _shards(_etcd())),
    "shards-postgres": ("postgres", _shards(_sql())),
    # The split workload: server nodes split from each other (soak/splits.py).
    "sentinel-split": ("redis", _sentinel_split()),
    "etcd3-split": ("etcd", _etcd_split()),
}
#: The labels of the election workload (``make soak``), and of the shards workload (``make soak SHARDS=1``).
ELECTION_LABELS = ("mariadb", "postgres", "redis", "etcd1", "etcd3")
SHARDS_LABELS = ("shards-etcd", "shards-postgres")
#: The labels of the split workload (``make soak SPLITS=1``).
SPLIT_LABELS = ("sentinel-split", "etcd3-split")
#: The names the shards workload spreads over its candidates.
SHARD_NAMES = tuple(f"s{i}" for i in range(12))
