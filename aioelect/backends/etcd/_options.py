"""The options of an etcd election, validated into :class:`EtcdSettings`.

Guarantees: :meth:`EtcdSettings.parse` accepts only options that keep one
leader (a renew deadline shorter than the lease, longer than the keep-alive
interval; whole-second TTLs that etcd grants, 2 to 9000000000 s) and reach
every endpoint the same way; anything else is a ValueError naming the
option, never the password.
The TLS files are read and checked here; nothing connects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TypedDict

from ...core._config import LockTiming, TimingRules, check_options, validate_name
from ._endpoints import Endpoint, parse_endpoints
from ._failures import MAX_TTL
from ._tls import EtcdTLS

__all__ = ["MAX_TTL", "MIN_TTL", "EtcdOptions", "EtcdSessionOptions", "EtcdSettings", "grant_problem"]

#: etcd grants no lease shorter than its minimum TTL (2 s with default timings).
MIN_TTL = 2

#: etcd's lease is its ``ttl``, in whole seconds. A leader is confirmed by keep-alives every ``ttl / 3``, as etcd's
#: Go client sends them, not by checks of its own; so the renew deadline defaults to ``2 * ttl / 3`` (not the 0.7
#: of the other backends): a whole keep-alive interval after the next keep-alive is due, and a whole one before the
#: lease can expire. etcd polls nothing: ``poll_interval`` keeps its default, unused.
TIMING = TimingRules(
    "the etcd lease's TTL",
    min_lease=MIN_TTL,
    whole_lease=True,
    max_lease=MAX_TTL,
    word="ttl",
    lease=5,
    renew_share=Fraction(2, 3),
    keepalive_share=Fraction(1, 3),
)


class EtcdSessionOptions(TypedDict, total=False):
    """How to reach etcd and keep a session's lease alive: the options of :class:`~aioelect.EtcdSession`."""

    #: The session lease in whole seconds, from 2 to 9000000000 (default 5); keep-alives go out every ``ttl / 3``,
    #: every ``ttl / 12`` while a leadership is held on the session.
    ttl: int
    #: etcd credentials: both or neither.
    username: str | None
    password: str | None
    #: Seconds to authenticate, and the bound on each request to one endpoint (default 5).
    connect_timeout: float
    #: Seconds a leader may go without an acknowledged keep-alive (default ``2 * ttl / 3``).
    renew_deadline: float | None
    #: PEM files: the CA that signs etcd's certificate (default: the system CAs), the client certificate and key.
    ca_file: str | None
    cert_file: str | None
    key_file: str | None


class _EtcdElectionName(TypedDict):
    #: The election's name: candidates' keys live under ``{name}/`` (at most 1024 characters).
    name: str


class EtcdOptions(_EtcdElectionName, EtcdSessionOptions, total=False):
    """The options of an etcd election; :meth:`EtcdSettings.parse` validates them."""

    #: Lead locally, WITHOUT mutual exclusion, while etcd has never answered (default False).
    degrade_to_local: bool


@dataclass(frozen=True)
class EtcdSettings:
    """Validated options of one etcd election."""

    endpoints: tuple[Endpoint, ...]
    tls: EtcdTLS | None
    name: str
    #: ``lease`` is the ttl, ``check_interval`` the keep-alive interval, ``check_timeout`` the bound on one.
    timing: LockTiming
    username: str | None
    password: str | None = field(repr=False)
    degrade_to_local: bool

    @classmethod
    def parse(cls, endpoints: str | Sequence[str], options: EtcdOptions, *, who: str = "EtcdElector") -> EtcdSettings:
        """Validate ``options`` for ``endpoints``: ValueError for a bad value, TypeError for an unknown option."""
        check_options(who, options, EtcdOptions)
        ca_file, cert_file, key_file = options.get("ca_file"), options.get("cert_file"), options.get("key_file")
        username, password = options.get("username"), options.get("password")
        degrade_to_local = options.get("degrade_to_local", False)
        parsed = parse_endpoints(endpoints)
        tls_files = any(f is not None for f in (ca_file, cert_file, key_file))
        plain = [e for e in parsed if e.scheme == "http"]
        if plain and tls_files:
            raise ValueError(
                f"endpoint http://{plain[0]} is plain HTTP but ca_file/cert_file/key_file ask for TLS: use https://"
            )
        https = parsed[0].scheme == "https"  # every endpoint's, as parse_endpoints checked
        tls = EtcdTLS.load(ca_file, cert_file, key_file) if tls_files or https else None
        name = validate_name(options["name"], max_length=1024)
        timing = TIMING.read(options)
        if (username is None) != (password is None):
            raise ValueError("username and password go together: pass both or neither")
        if username is not None and (not isinstance(username, str) or not username):
            raise ValueError("username must be a non-empty string")
        if password is not None and not isinstance(password, str):
            raise ValueError("password must be a string")
        if not isinstance(degrade_to_local, bool):
            raise ValueError(f"degrade_to_local must be True or False, not {degrade_to_local!r}")
        return cls(
            endpoints=tuple(parsed),
            tls=tls,
            name=name,
            timing=timing,
            username=username,
            password=password,
            degrade_to_local=degrade_to_local,
        )

    @property
    def ttl(self) -> int:
        """The lease etcd is asked for, in whole seconds: ``timing.lease``."""
        return int(self.timing.lease)

    @property
    def margin(self) -> float:
        """Seconds between a cut-off leader fencing itself and the earliest moment its lease can expire.

        ``ttl - renew_deadline``: the leader fences itself ``renew_deadline``
        after the send of its last acknowledged keep-alive, and etcd keeps the
        lease for the TTL it granted after that, never less than ``ttl``
        (a shorter grant is refused: :func:`grant_problem`).
        """
        return self.timing.margin

    @property
    def keepalive_interval(self) -> float:
        """Seconds between two keep-alives of a session: a third of the lease, as etcd's Go client."""
        return self.timing.check_interval

    @property
    def lead_interval(self) -> float:
        """Seconds between two keep-alives of a session while a leadership is held on it: ``ttl / 12``.

        A leader whose event loop blocks for ``B`` seconds keeps its leadership
        while ``lead_interval + B + one round trip < renew_deadline``: the last
        acknowledged keep-alive is at most ``lead_interval`` old when the block
        starts, and the first one after it is sent on waking. At the default
        ``renew_deadline`` (``2 * ttl / 3``) that is ``B < ttl / 2 + ttl / 12 -
        round trip``: half the lease, with ``ttl / 12`` for the round trip.
        Waiting candidates keep :attr:`keepalive_interval`.
        """
        return self.ttl / 12

    @property
    def keepalive_timeout(self) -> float:
        """Bound on one keep-alive: half the slack between two keep-alives at the waiting cadence and the
        deadline (at least 0.1 s), so a slow one is retried in time."""
        return self.timing.check_timeout

    @property
    def release_timeout(self) -> float:
        """Bound on resign and revoke: they end before the elector gives up on a release (5 s)."""
        return min(self.timing.connect_timeout, 4.0)


def grant_problem(asked: int, granted: int) -> str | None:
    """Why a lease etcd granted for ``granted`` seconds, when ``asked`` were asked, breaks the timing; None if not.

    The keep-alive interval, the renew deadline and :attr:`EtcdSettings.margin`
    are computed from the ttl asked: a shorter grant could expire while a
    leader still counts on it. A longer one (etcd's minimum TTL) only makes a
    crashed leader's key outlive it longer.
    """
    if granted >= asked:
        return None
    return (
        f"etcd granted a {granted}s lease for the {asked}s asked: the keep-alive interval and renew_deadline "
        f"are computed from ttl, so the lease could expire while a leader still counts on it; refusing to "
        f"campaign on it (lower ttl and renew_deadline to fit what etcd grants)"
    )
