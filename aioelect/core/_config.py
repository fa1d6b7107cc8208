"""Validation and parsing of user input, shared by every backend."""

from __future__ import annotations

import ipaddress
import math
import os
import re
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = [
    "default_identity",
    "validate_identity",
    "DEFAULT_NAME",
    "DSN",
    "LockTiming",
    "TIMING_OPTIONS",
    "TimingRules",
    "dsn_password",
    "check_options",
    "confirmation_gap",
    "keepalive_bound",
    "release_bound",
    "session_bounds",
    "is_loopback",
    "parse_dsn",
    "positive",
    "redact_dsn",
    "server_address",
    "transport_warning",
    "validate_name",
]

#: The name of a host-local election (file, local, memory) given none: a lock file's path is already specific
#: to it. The server backends have no default: every client of one server shares its lock names.
DEFAULT_NAME = "aioelect/leader"

_NAME_RE = re.compile(r"^[\x21-\x7e]+$")


def validate_name(name: str, *, max_length: int = 255) -> str:
    """Return ``name`` if it is 1 to ``max_length`` printable ASCII characters without spaces."""
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if len(name) > max_length:
        raise ValueError(f"name is {len(name)} characters long; this backend allows at most {max_length}")
    if not _NAME_RE.match(name):
        raise ValueError(f"name {name!r} must be printable ASCII without spaces")
    return name


def check_options(who: str, options: Mapping[str, object], spec: Any) -> None:
    """TypeError, as Python raises for a call, unless ``options`` fit ``spec`` (a TypedDict of options).

    Every key must be one ``spec`` names, and every key it requires must be there.
    """
    for key in options:
        if key not in spec.__required_keys__ and key not in spec.__optional_keys__:
            raise TypeError(f"{who}() got an unexpected keyword argument {key!r}")
    for key in sorted(spec.__required_keys__):
        if key not in options:
            raise TypeError(f"{who}() missing required keyword argument: {key!r}")


def positive(option: str, value: float, *, maximum: float | None = None, minimum: float | None = None) -> float:
    """Return ``value`` as a float if it is finite and > 0 (and within minimum..maximum), else raise ValueError."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{option} must be a number, not {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{option} must be a finite number > 0, not {value!r}")
    if minimum is not None and number < minimum:
        raise ValueError(f"{option} must be at least {minimum:g} seconds, not {value!r}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{option} must be at most {maximum:g}, not {value!r}")
    return number


# Characters a user name may hold unencoded in a URL (RFC 3986 userinfo without ':').
_PLAIN_USER_RE = re.compile(r"^[A-Za-z0-9._~%!$&'()*+,;=-]*$")


def redact_dsn(text: str) -> str:
    """``text`` with everything between the first ``://`` and the last ``@`` after it replaced by ``***``.

    Works on text only, so it hides the password of any DSN, including one
    that does not parse (an unencoded ``#``, ``/``, ``?`` or ``@`` in the
    password). The user name is kept only when it splits off unambiguously
    (``user:password@`` with a plain ``user``); everything else in the user
    information is hidden. Text without ``://`` or without ``@`` after it is
    returned as it is.
    """
    if not isinstance(text, str):
        text = str(text)
    start = text.find("://")
    if start < 0:
        return text
    start += 3
    end = text.rfind("@")
    if end < start:
        return text
    userinfo = text[start:end]
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon and user and _PLAIN_USER_RE.match(user) else "***"
    return f"{text[:start]}{shown}{text[end:]}"


def dsn_password(text: str) -> str | None:
    """The password in ``text`` that :func:`redact_dsn` hides: after the first ``:`` between ``://`` and the last ``@``.

    Found by text rather than parsed, so that the password of a DSN that
    does not parse is found too; None when there is none.
    """
    start, end = text.find("://"), text.rfind("@")
    if start < 0 or end < start + 3:
        return None
    _, colon, password = text[start + 3 : end].partition(":")
    return password if colon and password else None


def is_loopback(host: str | None) -> bool:
    """True if ``host`` can only mean this machine.

    That is ``localhost``, an address in 127.0.0.0/8, ``::1`` (with or
    without brackets, IPv4-mapped too), or a Unix socket path (starting with
    ``/``). Any other name is assumed to travel over a network.
    """
    if not host:
        return False
    host = host.strip()
    if host.startswith("/"):
        return True
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def transport_warning(host: str | None, *, encrypted: bool, verified: bool, fix: str = "") -> str | None:
    """The WARNING to log once for a connection to ``host``, or None when it needs none.

    None when the host is loopback (see :func:`is_loopback`) or the
    connection is encrypted with a verified server. Otherwise a sentence
    saying what an attacker on the network can do, followed by ``fix``
    (how to turn verification on, in the backend's own option names).
    """
    if is_loopback(host) or (encrypted and verified):
        return None
    if not encrypted:
        text = (
            f"the connection to {host} is not encrypted: the password and every query cross the network "
            "in clear text, and anyone on the path can read or change them"
        )
    else:
        text = (
            f"the connection to {host} is encrypted but the server's certificate is not verified: "
            "anyone on the path can impersonate the server and read the password"
        )
    return f"{text} ({fix})" if fix else text


@dataclass(frozen=True)
class DSN:
    """A parsed ``scheme://user:password@host:port/database?k=v`` address.

    The password never appears in ``repr()`` or ``str()``.
    """

    scheme: str
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    database: str | None = None
    query: dict[str, str] = field(default_factory=dict)

    def redacted(self) -> str:
        """The address with the password replaced by ``***``."""
        auth = ""
        if self.user is not None:
            auth = self.user + (":***" if self.password is not None else "") + "@"
        port = f":{self.port}" if self.port is not None else ""
        host = f"[{self.host}]" if self.host and ":" in self.host else (self.host or "")
        return f"{self.scheme}://{auth}{host}{port}/{self.database or ''}"

    def __str__(self) -> str:
        return self.redacted()


_ENCODE_HINT = (
    "percent-encode special characters in the user name, password and database name "
    "('#' as %23, '@' as %40, '/' as %2F, '?' as %3F, ':' in a user name as %3A, '%' as %25)"
)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _ambiguity(rest: str) -> str | None:
    """Why the text after ``scheme://`` cannot be read one way only, or None. Never quotes the text."""
    if _CONTROL_RE.search(rest):
        return "the DSN contains a control character (tab, newline, ...)"
    if "#" in rest:
        return "the DSN contains '#', which a URL reads as the start of a fragment that is ignored"
    authority_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    ats = rest.count("@")
    if ats > 1:
        return "the DSN contains more than one '@', so where the password ends is ambiguous"
    if ats == 1 and rest.index("@") > authority_end:
        return "the DSN has an '@' after a '/' or '?', so where the password ends is ambiguous"
    return None


def _port(hostport: str) -> int | str | None:
    """The port of ``host[:port]`` (or ``[v6]:port``): an int, None when absent, or a message (never quoting it)."""
    if hostport.startswith("["):
        _, bracket, after = hostport.partition("]")
        if not bracket or (after and not after.startswith(":")):
            return "the DSN's IPv6 address must be written as [address] or [address]:port"
        text = after[1:] if after else ""
    elif hostport.count(":") > 1:
        return "the DSN's IPv6 address must be written as [address] or [address]:port"
    else:
        _, _, text = hostport.rpartition(":") if ":" in hostport else ("", "", "")
    if not text:
        return None
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        return "the DSN's port must be a number from 1 to 65535"
    return int(text)


def parse_dsn(dsn: str, *schemes: str) -> DSN:
    """Parse ``dsn``, whose scheme must be one of ``schemes``.

    A DSN that could be read more than one way is refused rather than
    guessed at: a ``#`` (fragment), more than one ``@``, an ``@`` after the
    first ``/`` or ``?`` (an unencoded ``/`` or ``?`` in the password), a
    control character, a port that is not a number from 1 to 65535, or a
    query key given twice. Every ValueError raised here contains no part of
    the DSN except the scheme and query keys, and chains no exception that
    does: a password can never leak through it.
    """
    shape = f"a DSN must look like {schemes[0]}://user:password@host:port/database"
    if not isinstance(dsn, str) or "://" not in dsn:
        raise ValueError(shape)
    scheme, _, rest = dsn.partition("://")
    if scheme not in schemes:
        shown = repr(scheme) if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,20}", scheme) else "something else"
        raise ValueError(f"DSN scheme must be one of {', '.join(schemes)}, not {shown}")
    problem = _ambiguity(rest)
    parts = None
    if problem is None:
        try:
            parts = urlsplit(dsn)
        except ValueError:
            problem = "the DSN's host is malformed"
    port = _port(parts.netloc.rpartition("@")[2]) if parts is not None else None
    if isinstance(port, str):
        problem = port
    if problem is not None or parts is None or isinstance(port, str):
        # Raised outside any except block: no chained exception can carry the DSN's text.
        raise ValueError(f"{problem}; {_ENCODE_HINT}")
    query: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in query:
            raise ValueError(f"DSN parameter {key!r} is given more than once")
        query[key] = value
    return DSN(
        scheme=scheme,
        host=parts.hostname,
        port=port,
        user=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        database=unquote(parts.path.lstrip("/")) or None,
        query=query,
    )


#: The default bound on one lock check of a session-lock backend, in seconds.
CHECK_TIMEOUT = 2.0
#: The default time between two confirmations of a leader, in seconds (a tenth of a shorter lease).
CHECK_INTERVAL = 1.0
#: The least check_timeout derived from a short renew deadline; below it the default is kept (and refused).
MIN_DERIVED_CHECK_TIMEOUT = 0.5


@dataclass(frozen=True)
class TimingRules:
    """What one backend makes of the timing options: their defaults, the bounds on ``lease``, what it becomes.

    The one validation, :meth:`LockTiming.checked`, reads these and nothing
    else that differs between backends.
    """

    #: The server-side thing ``lease`` becomes, for messages ("wait_timeout").
    server_timeout: str
    #: The least lease, the most, and whether it counts whole seconds.
    min_lease: float
    whole_lease: bool
    max_lease: float = 86400
    #: The public name of the lease option: ``lease``, or etcd's own ``ttl``.
    word: str = "lease"
    #: The defaults of the options not given.
    lease: float = 10
    poll_interval: float = 2.0
    connect_timeout: float = 5.0
    #: The renew deadline given none, as a share of the lease.
    renew_share: float | Fraction = 0.7
    #: A backend confirmed by keep-alives at a fixed share of the lease (etcd) sets it: ``check_interval`` is then
    #: that share, not an option, and the renew deadline must outlast one keep-alive interval.
    keepalive_share: Fraction | None = None

    def read(self, options: Mapping[str, Any]) -> LockTiming:
        """The timing ``options`` give (keyword arguments by their public names), validated: :meth:`LockTiming.checked`.

        The only place the shared timing options are read by name: every backend keeps the :class:`LockTiming`
        this returns and reads its attributes.
        """
        return LockTiming.checked(
            self,
            lease=options.get(self.word, self.lease),
            renew_deadline=options.get("renew_deadline"),
            poll_interval=options.get("poll_interval", self.poll_interval),
            check_interval=options.get("check_interval"),
            check_timeout=options.get("check_timeout"),
            connect_timeout=options.get("connect_timeout", self.connect_timeout),
        )


#: The timing options a backend reads through :meth:`TimingRules.read`, by their public names.
TIMING_OPTIONS = ("lease", "renew_deadline", "poll_interval", "check_interval", "check_timeout", "connect_timeout")


@dataclass(frozen=True)
class LockTiming:
    """The timing of a lock a server keeps for a silent holder for ``lease`` seconds, checked as a whole.

    Every server backend keeps one (MySQL, PostgreSQL, Redis, etcd), built
    by :meth:`TimingRules.read` from the constructor's options.

    Guarantees ``check_interval + 2 * check_timeout <= renew_deadline < lease``:
    a healthy leader confirms before its deadline (a confirmation is dated
    from its send; the check before it may take up to ``check_timeout``,
    then ``check_interval`` passes, then this one takes up to
    ``check_timeout`` again), and a silent one stops before the server can
    drop its session and hand the lock on. ``poll_interval`` is not bound by
    the renew deadline: every backend that uses it dates a new leadership from
    a statement sent after the grant, never from a lock request that may have
    waited on the server. Where the rules set ``keepalive_share`` (etcd),
    ``check_interval`` is the keep-alive interval and ``check_timeout`` the
    bound on one keep-alive, and the guarantee is
    ``check_interval < renew_deadline < lease`` instead.

    ``lease`` is the earliest moment the server may end a session it no
    longer hears from only if every other server-side bound is at least as
    long: :meth:`server_problem` checks the bounds a backend reads from the
    server at connect, and :attr:`margin` is only true once it has passed.
    """

    poll_interval: float
    check_interval: float
    check_timeout: float
    connect_timeout: float
    lease: float
    renew_deadline: float

    @classmethod
    def checked(
        cls,
        rules: TimingRules,
        *,
        poll_interval: float,
        check_interval: float | None,
        check_timeout: float | None,
        connect_timeout: float,
        lease: float,
        renew_deadline: float | None,
    ) -> LockTiming:
        """Validate the options (ValueError saying why, naming ``lease`` by ``rules.word``).

        ``renew_deadline`` defaults to ``rules.renew_share`` of the lease.

        ``check_interval`` defaults to :data:`CHECK_INTERVAL` (1 s), or a
        tenth of a lease shorter than 10 s: at the default renew deadline a
        leader whose event loop blocks for half the lease then keeps it while
        ``check_interval + 2 * round trip <= 0.2 * lease`` (the last
        confirmation is at most ``check_interval`` and a round trip old when
        the block starts, and the first check after it needs one more).

        ``check_timeout`` defaults to :data:`CHECK_TIMEOUT` (2 s), or, where
        the renew deadline is too short for it, to the most that fits,
        ``(renew_deadline - check_interval) / 2``, if that is at least
        :data:`MIN_DERIVED_CHECK_TIMEOUT` (0.5 s).

        With ``rules.keepalive_share``, ``check_interval`` is that share of
        the lease and ``check_timeout`` half the slack between a keep-alive
        and the deadline (at least 0.1 s), both derived, never given.
        """
        word, becomes = rules.word, rules.server_timeout
        if isinstance(lease, bool):
            raise ValueError(f"{word} must be a number of seconds, not {lease!r}")
        given = lease
        lease = positive(word, lease)
        if lease > rules.max_lease:
            raise ValueError(
                f"{word} must be at most {rules.max_lease:.0f} seconds (it becomes {becomes}), not {given!r}"
            )
        if rules.whole_lease and not lease.is_integer():
            raise ValueError(f"{word} must be a whole number of seconds (it becomes {becomes}), not {given!r}")
        if lease < rules.min_lease:
            raise ValueError(f"{word} must be at least {rules.min_lease:g} seconds (it becomes {becomes})")
        if rules.keepalive_share is not None:
            check_interval = _share(lease, rules.keepalive_share)
        check_interval = positive(
            "check_interval", check_interval if check_interval is not None else min(CHECK_INTERVAL, lease / 10)
        )
        deadline = (
            positive("renew_deadline", renew_deadline)
            if renew_deadline is not None
            else _share(lease, rules.renew_share)
        )
        if rules.keepalive_share is not None:
            check_timeout = max(0.1, min(check_interval, deadline - check_interval) / 2)
        elif check_timeout is None:
            fits = (deadline - check_interval) / 2
            check_timeout = min(CHECK_TIMEOUT, fits) if fits >= MIN_DERIVED_CHECK_TIMEOUT else CHECK_TIMEOUT
        check_timeout = positive("check_timeout", check_timeout)
        if deadline >= lease:
            raise ValueError(
                f"renew_deadline ({deadline:g}s) must be shorter than {word} ({lease:g}s): "
                "a leader must stop before the server can hand the lock to someone else"
            )
        if rules.keepalive_share is not None:
            if deadline <= check_interval:
                raise ValueError(
                    f"renew_deadline ({deadline:g}s) must be longer than the keep-alive interval "
                    f"{word}/{rules.keepalive_share.denominator} ({check_interval:.3g}s): otherwise a healthy leader "
                    "would fence itself between two keep-alives"
                )
        else:
            gap = confirmation_gap(check_interval, check_timeout)
            if gap > deadline:
                raise ValueError(
                    f"check_interval + 2 * check_timeout ({gap:g}s) must not exceed renew_deadline ({deadline:g}s): "
                    "two confirmations can be that far apart on a healthy but slow server (a check answered just "
                    "within check_timeout, check_interval, then the next one answered just within check_timeout), "
                    "so a healthy leader would fence itself"
                )
        return cls(
            poll_interval=positive("poll_interval", poll_interval, maximum=3600),
            check_interval=check_interval,
            check_timeout=check_timeout,
            connect_timeout=positive("connect_timeout", connect_timeout),
            lease=lease,
            renew_deadline=deadline,
        )

    @property
    def deposed_within(self) -> float:
        """Seconds within which a leader whose lock was taken, or whose server stopped answering, has ``held`` False.

        :func:`confirmation_gap`: the check sent just before the loss may
        still be answered "held" up to ``check_timeout`` after its send; the
        next goes out ``check_interval`` after that answer and is answered
        (not held) or given up on ``check_timeout`` after its send. The renew
        deadline, never shorter, cannot end it later. A session the server
        closes is noticed at once instead.
        """
        return confirmation_gap(self.check_interval, self.check_timeout)

    @property
    def margin(self) -> float:
        """Seconds between a cut-off leader fencing itself and the earliest moment the lock can pass on.

        ``lease - renew_deadline``; it holds once :meth:`server_problem` has
        found no server-side bound shorter than ``lease``.
        """
        return self.lease - self.renew_deadline

    def server_problem(self, bounds: Mapping[str, float | None], *, product: str) -> str | None:
        """Why the server-side ``bounds`` break this timing, naming the shortest offending one; None if none does.

        ``bounds`` maps each setting (as the user would change it) to the
        seconds after which the server may end a session it no longer hears
        from because of it, None where it is off. Every one must be at least
        ``lease``: the leader fences itself ``renew_deadline`` after the send
        of its last confirmation, and the documented margin (:attr:`margin`)
        assumes the server keeps the session for ``lease`` after that.
        """
        found = release_bound(bounds)
        if found is None or found[1] >= self.lease:
            return None
        setting, seconds = found
        return (
            f"{product} may end the lock session {seconds:g}s after it last heard from the leader ({setting}), "
            f"sooner than lease ({self.lease:g}s): a leader cut off from the server keeps leading until its "
            f"renew_deadline ({self.renew_deadline:g}s), so the lock could pass on while it still leads; raise "
            f"{setting} to at least {self.lease:g}s on the server, or lower lease (and renew_deadline) below it"
        )


def _share(lease: float, share: float | Fraction) -> float:
    """``share`` of ``lease``; a Fraction p/q as ``lease * p / q``, so that 2/3 of a 6 s lease is exactly 4 s."""
    if isinstance(share, Fraction):
        return lease * share.numerator / share.denominator
    return lease * share


def confirmation_gap(check_interval: float, check_timeout: float) -> float:
    """The longest time between the sends of two successive confirmations of a healthy leader, answered in time.

    A check sent at t may be answered at ``t + check_timeout``; the next is
    sent ``check_interval`` later and answered up to ``check_timeout`` after
    that: the keeper then learns of a confirmation sent at t at ``t +
    check_interval + 2 * check_timeout``. The same gap bounds how long a
    deposed leader goes on (:attr:`LockTiming.deposed_within`): the renew
    deadline must be at least this long, and the documentation and the
    soak's overlap margin state this bound.
    """
    return check_interval + 2 * check_timeout


def release_bound(bounds: Mapping[str, float | None]) -> tuple[str, float] | None:
    """The shortest of ``bounds`` (setting, seconds) that is on (not None, > 0), or None if all are off."""
    on = [(seconds, setting) for setting, seconds in bounds.items() if seconds is not None and seconds > 0]
    if not on:
        return None
    seconds, setting = min(on)
    return setting, seconds


def session_bounds(
    values: Mapping[str, float], timeouts: Sequence[str], keepalives: tuple[str, str, str]
) -> dict[str, float | None]:
    """The server-side bounds of a session whose settings (name -> seconds) are ``values``.

    Each of ``timeouts`` as it is (0 or absent: off), then the TCP keepalive
    bound of the settings ``keepalives`` names (idle, interval, count), named
    ``"idle + interval * count"`` (see :func:`keepalive_bound`).
    """
    bounds = {name: values.get(name) or None for name in timeouts}
    idle, interval, count = keepalives
    bounds[f"{idle} + {interval} * {count}"] = keepalive_bound(
        values.get(idle, 0), values.get(interval, 0), values.get(count, 0)
    )
    return bounds


def keepalive_bound(idle: float, interval: float, count: float) -> float | None:
    """Seconds after which TCP keepalives end a connection to an unreachable peer, at the earliest; None if off.

    ``idle`` of 0 means the kernel's default (Linux: 7200 s), taken as off:
    it is far above any lease. A 0 ``interval`` or ``count`` (the kernel's
    default) counts as 0, so the bound is never overstated.
    """
    if idle <= 0:
        return None
    return idle + max(interval, 0) * max(count, 0)


def server_address(
    parsed: DSN | None, host: str | None, port: int | None, *, default_port: int, who: str
) -> tuple[str, int]:
    """``host`` and ``port`` from the keyword arguments, else the DSN, else the default port; ValueError if none."""
    host = host or (parsed.host if parsed else None)
    if not host:
        raise ValueError(f"{who} needs a dsn or a host")
    port = port if port is not None else (parsed.port if parsed and parsed.port else default_port)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be an integer from 1 to 65535, not {port!r}")
    return host, port


_IDENTITY_RE = re.compile(r"^[\x21-\x7e][\x20-\x7e]{0,127}$")


def default_identity() -> str:
    """``hostname:pid:`` and a short random suffix: unique per elector."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def validate_identity(identity: str) -> str:
    """Return ``identity`` if it is 1 to 128 printable ASCII characters, else raise ValueError."""
    if not isinstance(identity, str) or not _IDENTITY_RE.match(identity):
        raise ValueError("identity must be 1 to 128 printable ASCII characters, not starting with a space")
    return identity
