"""--health-url never shows a password, even one with an unescaped '/', '?' or '#'."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioelect.cli._health_url import parse_health_url
from aioelect.cli._status import UsageError

from .test_cli import cli


@pytest.mark.parametrize(
    "url",
    [
        "http://user:hunter2/x@127.0.0.1:8080/healthz",  # urllib: host 'user', port 'hunter2'
        "http://user:hunter2#x@127.0.0.1:8080/healthz",
        "http://user:hunter2?x@127.0.0.1:8080/healthz",
        "http://user:1234/hunter2@127.0.0.1:8080/healthz",  # a valid URL to host 'user', port 1234
    ],
)
def test_a_password_with_an_unescaped_delimiter_is_never_shown(url: str, tmp_path: Path) -> None:
    try:
        shown = repr(parse_health_url(url))
    except UsageError as exc:
        shown = str(exc)
    assert "hunter2" not in shown, shown
    done = cli("run", "--file", str(tmp_path / "lock"), "--name", "g", "--health-url", url, "--", "true")
    assert "hunter2" not in done.stderr, done.stderr
