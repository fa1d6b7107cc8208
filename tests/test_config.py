"""Input parsing shared by every backend: DSNs, redaction, transport warnings, lock timing."""

from __future__ import annotations

import pytest

from aioelect._config import is_loopback, redact_dsn, transport_warning

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
