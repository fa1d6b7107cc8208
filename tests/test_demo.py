"""The scheduler demo (``make demo``), end to end: it runs to the end and shows a clean takeover.

Each case runs ``examples/demo.py`` as ``make demo`` does, bounded in time,
and checks both the printed timeline and the JSON summary it writes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "demo.py"
#: Shorter phases than the default, to keep the suite quick; the default run is tested once.
SHORT = ["--kill-after", "3", "--run-after", "2"]


def run_demo(tmp_path: Path, *args: str, timeout: float = 120.0, **env: str) -> tuple[str, dict[str, Any]]:
    summary_path = tmp_path / "summary.json"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIOELECT_")}
    environ.update(env)
    result = subprocess.run(
        [sys.executable, str(DEMO), *args, "--summary-json", str(summary_path)],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=environ,
    )  # fmt: skip
    assert result.returncode == 0, f"demo failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout, json.loads(summary_path.read_text())


def settings(output: str) -> dict[str, str]:
    """The demo's settings line, printed before any instance starts: its backend and the elector options every
    instance runs with."""
    found = re.search(r"^settings: backend (\w+), options (.*); every other option at its default$", output, re.M)
    assert found, f"the demo does not print its settings:\n{output[:800]}"
    assert found.start() < output.index("LEADER"), "the settings line comes before the first event"
    options = dict(item.split("=", 1) for item in found.group(2).split()) if found.group(2) != "none" else {}
    return {"backend": found.group(1), **options}


def check_takeover(output: str, summary: dict[str, Any], takeover_bound: float) -> None:
    """What the demo must show: one leader at a time, a takeover, no job fired twice."""
    assert summary["ok"] and summary["finished"]
    assert "result: OK" in output and "no job fired twice" in output and "takeover:" in output
    leaderships = summary["leaderships"]
    assert len(leaderships) >= 2
    assert leaderships[0]["ended"] == "killed" and leaderships[0]["instance"] == summary["killed"]
    assert summary["new_leader"] not in (None, summary["killed"])
    assert 0 <= summary["takeover_seconds"] < takeover_bound
    assert summary["duplicates"] == [] and summary["overlaps"] == []
    assert all(entry["fires"] > 0 for entry in leaderships[:2]), leaderships
    fires = [e for e in summary["events"] if e["event"] in ("fire", "retry")]
    assert len(fires) == summary["fires"] == summary["distinct_fires"] > 0
    # Every fire carries the token of the leadership it was fired under, and happens inside it.
    for entry in leaderships:
        end = entry["end"] if entry["end"] is not None else float("inf")
        for fire in fires:
            if fire["instance"] == entry["instance"] and entry["start"] <= fire["t"] <= end:
                assert fire["token"] == entry["token"]
    for fire in fires:
        assert any(
            entry["instance"] == fire["instance"]
            and entry["start"] <= fire["t"] <= (entry["end"] if entry["end"] is not None else float("inf"))
            for entry in leaderships
        ), f"{fire} fired outside any leadership"
    if None not in (leaderships[0]["token"], leaderships[1]["token"]):
        assert leaderships[1]["token"] > leaderships[0]["token"]


def test_make_demo_without_arguments_runs_to_the_end(tmp_path: Path) -> None:
    """Exactly what ``make demo`` runs on a fresh machine: no backend named, default timings."""
    output, summary = run_demo(tmp_path)
    assert summary["backend"] in ("file", "mysql")
    assert settings(output)["backend"] == summary["backend"]
    check_takeover(output, summary, takeover_bound=5.0)
    assert summary["retries"] >= 1 or summary["fires"] >= 8  # the retry loop usually has work too
    assert output.count("LEADER") >= 2 and "KILL" in output and "FOLLOW" in output


def test_demo_on_mysql(tmp_path: Path, mysql_dsn: str) -> None:
    output, summary = run_demo(tmp_path, "--backend", "mysql", *SHORT, AIOELECT_MYSQL_DSN=mysql_dsn)
    assert summary["backend"] == "mysql"
    check_takeover(output, summary, takeover_bound=5.0)


def test_demo_starts_its_own_mariadb(tmp_path: Path) -> None:
    """``make demo BACKEND=mysql`` on a machine where only the server packages are installed."""
    from .harness import MissingBinaryError, require_binary
    from .harness.plugin import server_unavailable

    try:
        require_binary("mariadbd", "mysqld")
    except MissingBinaryError as exc:
        server_unavailable(str(exc))
    output, summary = run_demo(tmp_path, "--backend", "mysql", *SHORT)
    assert "throwaway" in output
    check_takeover(output, summary, takeover_bound=5.0)


def test_demo_on_etcd(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pytest.importorskip("aioelect.backends.etcd")  # the lead removes this skip once etcd has landed
    endpoints: list[str] = request.getfixturevalue("etcd_endpoints")
    output, summary = run_demo(tmp_path, "--backend", "etcd", *SHORT, AIOELECT_ETCD_ENDPOINTS=",".join(endpoints))
    # The killed leader's lease (ttl=3) must expire first.
    check_takeover(output, summary, takeover_bound=10.0)
    shown = settings(output)
    assert shown["backend"] == "etcd"
    assert f"`ttl={shown['ttl']}`" in " ".join((ROOT / "README.md").read_text().split()), "the README's demo ttl"


def test_demo_on_postgres(tmp_path: Path, postgres_dsn: str) -> None:
    pytest.importorskip("aioelect.backends.sql.postgres")
    output, summary = run_demo(tmp_path, "--backend", "postgres", *SHORT, AIOELECT_POSTGRES_DSN=postgres_dsn)
    check_takeover(output, summary, takeover_bound=5.0)


def test_demo_on_redis(tmp_path: Path, redis_url: str) -> None:
    output, summary = run_demo(tmp_path, "--backend", "redis", *SHORT, AIOELECT_REDIS_URL=redis_url)
    assert summary["backend"] == "redis"
    # The killed leader's key (lease=3) must expire first.
    check_takeover(output, summary, takeover_bound=10.0)
    shown = settings(output)
    assert shown["backend"] == "redis"
    assert float(shown["lease"]) <= summary["takeover_seconds"] + 0.5  # the takeover waited for the demo's lease
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"`lease={shown['lease']}`" in readme, "the README says what lease the demo runs Redis with"


def test_demo_on_local_shows_why_exclusion_matters(tmp_path: Path) -> None:
    """The negative control: without mutual exclusion the duplicate check must fire."""
    output, summary = run_demo(tmp_path, "--backend", "local", "--kill-after", "2.5", "--run-after", "0.5")
    assert summary["ok"] and not summary["exclusive"]
    assert len(summary["duplicates"]) >= 1 and summary["overlaps"]
    assert summary["fires"] > summary["distinct_fires"]
    assert "fired more than once" in output and "expected" in output


def test_demo_rejects_bad_options(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(DEMO), "--instances", "1"], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert result.returncode == 2 and "at least 2" in result.stderr
