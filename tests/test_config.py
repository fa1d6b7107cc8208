"""Input parsing shared by every backend: DSNs, redaction, transport warnings, lock timing."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from aioelect.core._config import LockTiming, TimingRules, is_loopback, parse_dsn, redact_dsn, transport_warning

# --- redaction by text ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("mysql://root:s3cret@db/app", "mysql://root:***@db/app"),
        # Unencoded characters that break URL parsing: the text is still redacted.
        ("mysql://root:1234#5@db/app", "mysql://root:***@db/app"),
        ("mysql://root:a/b?c@db/app", "mysql://root:***@db/app"),
        ("mysql://root:p@ss@w@rd@db:3306/app", "mysql://root:***@db:3306/app"),
        # A user that does not split off unambiguously is hidden too.
        ("mysql://ro@ot:pw@db/app", "mysql://***@db/app"),
        ("mysql://:pw@db/app", "mysql://***@db/app"),
        ("mysql://just-a-token@db/app", "mysql://***@db/app"),
        # Nothing to hide.
        ("mysql://db:3306/app", "mysql://db:3306/app"),
        ("no dsn here", "no dsn here"),
        ("user@host without a scheme", "user@host without a scheme"),
        # Inside a longer message: everything up to the last '@' goes.
        ("cannot reach postgresql://u:pw@h/db (down)", "cannot reach postgresql://u:***@h/db (down)"),
    ],
)
def test_redact_dsn_hides_everything_between_scheme_and_last_at(text: str, shown: str) -> None:
    assert redact_dsn(text) == shown


# --- loopback and transport warnings ---------------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["localhost", "LOCALHOST", "localhost.", "127.0.0.1", "127.9.8.7", "::1", "[::1]", "::ffff:127.0.0.1", "/run/sock"],
)
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)
    assert transport_warning(host, encrypted=False, verified=False) is None


@pytest.mark.parametrize(
    "host", ["db.example.com", "10.0.0.5", "192.168.1.1", "::2", "fe80::1", "localhost.evil.com", "", None]
)
def test_non_loopback_hosts(host: str | None) -> None:
    assert not is_loopback(host)


def test_transport_warning_names_what_is_missing() -> None:
    plain = transport_warning("db.example.com", encrypted=False, verified=False, fix="set ssl_mode")
    assert plain is not None and "not encrypted" in plain and "db.example.com" in plain and "set ssl_mode" in plain
    unverified = transport_warning("db.example.com", encrypted=True, verified=False)
    assert unverified is not None and "not verified" in unverified
    assert transport_warning("db.example.com", encrypted=True, verified=True) is None


# --- DSNs that do not parse unambiguously -------------------------------------------------

SECRET = "1234#5/6?7@8x"


def substrings(secret: str, length: int = 3) -> set[str]:
    return {secret[i : i + length] for i in range(len(secret) - length + 1)}


def assert_no_part_of(secret: str, exc: BaseException) -> None:
    """Neither the error nor anything chained to it shows 3 characters in a row of ``secret``."""
    seen: BaseException | None = exc
    texts = []
    while seen is not None:
        texts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    for text in texts:
        leaked = [part for part in substrings(secret) if part in text]
        assert not leaked, f"{text!r} shows {leaked}"


@pytest.mark.parametrize(
    ("dsn", "secret", "why"),
    [
        # '#' starts a fragment: read as host root, port 1234.
        ("mysql://root:1234#5@db/app", "1234#5", "#"),
        ("mysql://root:Xq9Zw#@db/app", "Xq9Zw#", "#"),
        # '/' ends the authority early: the rest is read as the path.
        ("mysql://root:abc/def@db/app", "abc/def", "@"),
        # '?' starts the query early.
        ("mysql://root:abc?def@db/app", "abc?def", "@"),
        # A second '@' in the authority.
        ("mysql://root:abc@def@db/app", "abc@def", "@"),
        ("mysql://ro@ot:abcdef@db/app", "abcdef", "@"),
        # An '@' after the authority.
        ("postgresql://root:abcdef@db/app@other", "abcdef", "@"),
        (f"mysql://root:{SECRET}@db:3306/app", SECRET, "percent-encode"),
        # A control character (urlsplit would silently drop a tab or newline).
        ("mysql://root:abc\tdef@db/app", "abc\tdef", "control"),
    ],
)
def test_ambiguous_dsn_is_refused_without_showing_the_password(dsn: str, secret: str, why: str) -> None:
    with pytest.raises(ValueError, match="percent-encode") as info:
        parse_dsn(dsn, "mysql", "postgresql")
    assert why in str(info.value)
    assert_no_part_of(secret, info.value)


@pytest.mark.parametrize(
    "dsn", ["mysql://root:abcdef@db:qwxz/app", "mysql://root:abcdef@db:99999/app", "mysql://root:abcdef@db:-1/app"]
)
def test_bad_port_is_refused_without_showing_the_password(dsn: str) -> None:
    with pytest.raises(ValueError, match="port") as info:
        parse_dsn(dsn, "mysql")
    assert_no_part_of("abcdef", info.value)
    assert_no_part_of("qwxz", info.value)


def test_duplicate_query_keys_are_refused() -> None:
    with pytest.raises(ValueError, match=r"ssl_mode.*more than once"):
        parse_dsn("mysql://db/app?ssl_mode=DISABLED&ssl_mode=VERIFY_IDENTITY", "mysql")


def test_percent_encoded_password_parses_exactly() -> None:
    parsed = parse_dsn(f"mysql://r%40ot:{quote(SECRET, safe='')}@db:3306/app?ssl_mode=DISABLED", "mysql")
    assert (parsed.user, parsed.password, parsed.host, parsed.port, parsed.database) == (
        "r@ot",
        SECRET,
        "db",
        3306,
        "app",
    )
    assert parsed.query == {"ssl_mode": "DISABLED"}
    assert SECRET not in repr(parsed) and SECRET not in str(parsed)
    # A ':' in the password is unambiguous: the user ends at the first one.
    assert parse_dsn("mysql://root:a:b@db/app", "mysql").password == "a:b"
    v6 = parse_dsn("postgresql://[::1]:5433/app", "postgresql")
    assert (v6.host, v6.port, str(v6)) == ("::1", 5433, "postgresql://[::1]:5433/app")
    with pytest.raises(ValueError, match=r"\[address\]"):
        parse_dsn("mysql://::1/app", "mysql")  # port 1 of host ''? Refused.


def test_dsn_shape_errors_do_not_echo_the_dsn() -> None:
    with pytest.raises(ValueError, match="scheme") as info:
        parse_dsn("postgres://root:abcdef@db/app", "mysql")
    assert_no_part_of("abcdef", info.value)
    with pytest.raises(ValueError, match="DSN") as info:
        parse_dsn("root:abcdef@db/app", "mysql")
    assert_no_part_of("abcdef", info.value)


# --- lock timing ---------------------------------------------------------------------------


def timing(**kw: object) -> LockTiming:
    options: dict[str, object] = {
        "poll_interval": 2.0,
        "check_interval": 1.0,
        "check_timeout": 2.0,
        "connect_timeout": 5.0,
        "lease": 10.0,
        "renew_deadline": None,
    }
    rules = TimingRules("wait_timeout", min_lease=2, whole_lease=False)
    return LockTiming.checked(rules, **{**options, **kw})  # type: ignore[arg-type]


def test_two_confirmations_of_a_slow_healthy_server_fit_in_the_renew_deadline() -> None:
    """A check answered just within check_timeout, check_interval, and the next answered just within it again.

    The keeper then learns of the earlier send's confirmation check_interval + 2 * check_timeout after it:
    a renew deadline shorter than that fences a healthy leader.
    """
    with pytest.raises(ValueError, match=r"check_interval \+ 2 \* check_timeout \(5s\).*renew_deadline \(4.5s\)"):
        timing(renew_deadline=4.5)  # 1 + 2 = 3 <= 4.5, but 1 + 2 * 2 = 5 > 4.5
    assert timing(renew_deadline=5).renew_deadline == 5


def test_server_bounds_shorter_than_the_lease_are_named() -> None:
    """Every server-side bound on a silent session must be at least lease; the shortest one too short is named."""
    t = timing(lease=10, renew_deadline=7)
    assert t.margin == 3
    assert t.server_problem({"wait_timeout": 10, "tcp_keepalive_time": None}, product="MySQL") is None
    problem = t.server_problem(
        {"wait_timeout": 10, "tcp_keepalives_idle + interval * count": 8, "tcp_user_timeout": 9}, product="PostgreSQL"
    )
    assert problem is not None
    assert "tcp_keepalives_idle + interval * count" in problem and "8s" in problem and "lease (10s)" in problem
    assert t.server_problem({"tcp_user_timeout": 0}, product="PostgreSQL") is None  # 0: off


def test_poll_interval_is_not_bound_by_the_renew_deadline() -> None:
    """A leadership is dated from a check sent after the grant: a long wait for the lock does not shorten it."""
    assert timing(poll_interval=10, lease=10).renew_deadline == 7
    with pytest.raises(ValueError, match="poll_interval"):
        timing(poll_interval=0)


def test_the_default_check_timeout_fits_a_short_renew_deadline() -> None:
    """Not given, check_timeout is 2 s, or the most that fits the renew deadline (at least 0.5 s)."""
    assert timing(check_timeout=None).check_timeout == 2  # lease 10: 1 + 2 * 2 <= 7
    short = timing(check_timeout=None, lease=5)  # renew_deadline 3.5: 1 + 2 * 1.25
    assert short.check_timeout == 1.25
    with pytest.raises(ValueError, match=r"check_interval \+ 2 \* check_timeout \(5s\)"):
        timing(check_timeout=None, lease=2)  # (1.4 - 1) / 2 < 0.5: the default, refused
