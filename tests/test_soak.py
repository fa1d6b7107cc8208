"""The nemesis soak (soak/): its checker on constructed histories, and a short soak on every backend.

The short soak runs the five backends side by side (MariaDB, PostgreSQL,
Redis, single-member and three-member etcd), each for ``SOAK_SECONDS``, and fails
unless the checker passed. It starts its own servers; a missing one fails
in CI and skips elsewhere, as with every server test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from soak.checker import Act, Fault, History, Term, Write, check
from soak.nemesis import plan
from soak.timing import ELECTION_LABELS, SHARD_NAMES, SHARDS_LABELS, TIMINGS
from tests.faults import judge_terms
from tests.harness import MissingBinaryError, require_binary
from tests.harness.plugin import server_unavailable, skip_if_external

ROOT = Path(__file__).resolve().parent.parent
NS = 1_000_000_000
#: Each backend's run in the CI soak (the five run side by side).
SOAK_SECONDS = 100


def _leader(who: str, token: int, start: float, end: float, every: float = 0.04) -> list[Act]:
    """Acts of one leadership from ``start`` to ``end`` seconds, one every ``every`` s, all accepted."""
    acts = []
    t = start
    while t <= end + 1e-9:
        acts.append(Act(who, token, int(t * NS), int(t * NS) + 1_000_000, True))
        t += every
    return acts


def _history(acts: list[Act], *, faults: list[Fault] | None = None, leftovers: list[str] | None = None) -> History:
    """``acts`` as a fenced register would have taken them: a write with a token below the highest is refused."""
    judged: list[Act] = []
    writes: list[Write] = []
    highest = 0
    for act in sorted(acts, key=lambda a: a.t0):
        ok = (act.token or 0) >= highest
        judged.append(Act(act.who, act.token, act.t0, act.t1, ok))
        if ok:
            highest = act.token or 0
            writes.append(Write(len(writes), highest, act.who, act.t0))
    acts = judged
    return History(
        label="constructed",
        acts=acts,
        writes=writes,
        faults=faults or [],
        begin=0,
        end=int(max(a.t0 for a in acts)) + NS // 10,
        margin=0.9,
        base_gap=3.0,
        leftovers=leftovers or [],
    )


def _clean() -> list[Act]:
    """c1 leads 0-10 s, is killed at 10 s (a fault with a 3 s bound), c2 leads from 11.5 s to 20 s."""
    return _leader("c1", 5, 0.0, 10.0) + _leader("c2", 9, 11.5, 20.0)


def _kill_at_10() -> list[Fault]:
    return [Fault("kill", "c1 (leader)", 10 * NS, 10 * NS, 13 * NS)]


def test_checker_passes_a_clean_history() -> None:
    verdict = check(_history(_clean(), faults=_kill_at_10()))
    assert verdict.ok, verdict.violations
    assert [(t.who, t.token) for t in verdict.terms] == [("c1", 5), ("c2", 9)]
    assert verdict.accepted == len(_clean()) and verdict.rejected == 0
    assert 1.4 < verdict.max_gap < 1.6 and verdict.max_gap_bound == pytest.approx(3.0, abs=0.1)
    assert verdict.faults_by_kind == {"kill": 1}


def test_checker_reports_a_lower_token_accepted() -> None:
    history = _history(_clean(), faults=_kill_at_10())
    stale = Write(len(history.writes), 5, "c1", 12 * NS)  # c1's token, accepted after c2's token 9
    history.writes.append(stale)
    verdict = check(history)
    assert [v.kind for v in verdict.violations] == ["token"]
    assert "token 5 after write" in verdict.violations[0].message


def test_checker_reports_a_leadership_with_a_smaller_token() -> None:
    acts = _leader("c1", 9, 0.0, 10.0) + _leader("c2", 5, 11.0, 20.0)
    verdict = check(_history(acts, faults=_kill_at_10()))
    assert "token" in {v.kind for v in verdict.violations}
    assert any("not larger" in v.message for v in verdict.violations)


def test_checker_reports_an_overlap_beyond_the_margin() -> None:
    acts = _leader("c1", 5, 0.0, 10.0) + _leader("c2", 9, 8.5, 20.0)  # 1.5 s together, margin 0.9 s
    verdict = check(_history(acts))
    assert [v.kind for v in verdict.violations] == ["overlap"]
    assert verdict.max_overlap == pytest.approx(1.5, abs=0.05)


def test_checker_accepts_an_overlap_within_the_margin() -> None:
    acts = _leader("c1", 5, 0.0, 10.0) + _leader("c2", 9, 9.6, 20.0)  # 0.4 s: a deposed leader noticing
    verdict = check(_history(acts))
    assert verdict.ok, verdict.violations
    assert 0.3 < verdict.max_overlap < 0.5


def test_checker_reports_a_long_leaderless_gap() -> None:
    acts = _leader("c1", 5, 0.0, 10.0) + _leader("c2", 9, 14.0, 20.0)  # 4 s: over the kill's 3 s, no other fault
    verdict = check(_history(acts, faults=_kill_at_10()))
    assert [v.kind for v in verdict.violations] == ["gap"]
    assert "bound 3.00 s" in verdict.violations[0].message and "kill c1" in verdict.violations[0].message


def test_fault_suites_judge_their_terms_by_the_soak_checker() -> None:
    """tests/faults.py's judgement is this checker's: overlap beyond the margin, a token that does not grow and
    a leaderless stretch beyond the bound each fail it."""
    c1 = Term("c1", 5, 0, 10 * NS, 100)
    assert [t.who for t in judge_terms([Term("c2", 9, 10 * NS, 20 * NS, 100), c1], max_gap=1.0)] == ["c1", "c2"]
    late = Term("c2", 9, 9 * NS + NS // 2, 20 * NS, 100)
    with pytest.raises(AssertionError, match=r"split brain: c1 \(token 5\) and c2 \(token 9\) both acted for 0\.500 s"):
        judge_terms([c1, late])
    judge_terms([c1, late], margin=0.6)
    # A leadership inside c1's, even of one act: c1 went on for 7 s after c2's grant, beyond any margin.
    for inside in (Term("c2", 9, 3 * NS, 3 * NS, 100), Term("c2", 9, 3 * NS, 3 * NS + NS // 5, 100)):
        with pytest.raises(AssertionError, match=r"both acted for 7\.000 s \(margin 0\.60 s\): c2 led inside c1's"):
            judge_terms([c1, inside], margin=0.6)
    with pytest.raises(AssertionError, match=r"token went backwards: c2's leadership \(token 4\) started after c1's"):
        judge_terms([c1, Term("c2", 4, 10 * NS, 20 * NS, 100)])
    with pytest.raises(AssertionError, match=r"no leader: nobody led for 2\.00 s \(bound 1\.00 s"):
        judge_terms([c1, Term("c2", 9, 12 * NS, 20 * NS, 100)], max_gap=1.0)
    judge_terms([c1, Term("c2", 9, 12 * NS, 20 * NS, 100)])  # no bound given: the gap is not judged


def test_checker_takes_the_latest_deadline_of_the_faults_in_force() -> None:
    acts = _leader("c1", 5, 0.0, 10.0) + _leader("c2", 9, 14.0, 20.0)
    restart = Fault("restart", "server", 11 * NS, 12 * NS, 15 * NS)  # overlapping: the gap may last until 15 s
    verdict = check(_history(acts, faults=[*_kill_at_10(), restart]))
    assert verdict.ok, verdict.violations


def test_checker_reports_a_gap_at_the_end() -> None:
    history = _history(_clean(), faults=_kill_at_10())
    history.end = 30 * NS  # nobody led for the last 10 s
    verdict = check(history)
    assert [v.kind for v in verdict.violations] == ["gap"]


def test_checker_reports_leftovers_and_nemesis_errors() -> None:
    history = _history(_clean(), faults=_kill_at_10(), leftovers=["1 lease(s) left: ['694d...']"])
    history.errors.append("restart at 12.0s failed")
    verdict = check(history)
    assert [v.kind for v in verdict.violations] == ["leftover", "error"]


def test_checker_reports_nobody_ever_leading() -> None:
    history = _history(_clean())
    history.acts = []
    assert "nobody ever led" in [v.message for v in check(history).violations]


def test_schedule_is_a_function_of_the_seed() -> None:
    for label, (_, timing) in TIMINGS.items():
        kinds = ("kill", "pause", "depose", "partition", "restart", "slow")
        first = plan(7, label, kinds, 600, timing.lease)
        assert first == plan(7, label, kinds, 600, timing.lease)
        assert first != plan(8, label, kinds, 600, timing.lease)
        assert {p.kind for p in first} == set(kinds)
        assert all(p.at >= 3.0 and p.at + p.duration <= 600 - 12 for p in first)


def _require_servers() -> None:
    for kind in ("mysql", "etcd", "postgres", "redis"):
        skip_if_external(kind)
    try:
        for binary in ("mariadbd", "initdb", "etcd", "etcdctl", "redis-server"):
            require_binary(binary)
    except MissingBinaryError as exc:
        server_unavailable(str(exc))


@pytest.mark.timeout(SOAK_SECONDS + 150)
def test_short_soak_on_every_backend_passes(tmp_path: Path) -> None:
    _require_servers()
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "soak",
            "--minutes",
            str(SOAK_SECONDS / 60),
            "--seed",
            "20261201",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SOAK_SECONDS + 140,
    )
    wall = time.monotonic() - started
    report = (tmp_path / "report.md").read_text() if (tmp_path / "report.md").exists() else "(no report)"
    assert proc.returncode == 0, (
        f"soak failed (status {proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
    )
    assert "**passed**" in report
    for label in ELECTION_LABELS:
        faults = [json.loads(line) for line in (tmp_path / label / "faults.jsonl").read_text().splitlines()]
        assert len(faults) >= 3, f"{label}: only {len(faults)} faults injected"
        assert f"| {label} | pass |" in report
    assert (tmp_path / "soak.svg").read_text().startswith("<svg")
    print(f"short soak: {wall:.0f} s wall\n{report}")


def test_checker_does_not_count_the_time_a_deposed_leader_was_frozen() -> None:
    # c1 is frozen from 8 s to 11 s, deposed meanwhile; c2 leads from 9 s; c1 acts once on waking at 11 s.
    woken = Act("c1", 5, 11 * NS, 11 * NS + 1_000_000, True)
    acts = [*_leader("c1", 5, 0.0, 8.0), woken, *_leader("c2", 9, 9.0, 20.0)]
    pause = Fault("pause", "c1 (leader)", 8 * NS, 11 * NS, 14 * NS, candidate="c1")
    verdict = check(_history(acts, faults=[pause]))
    assert verdict.ok, verdict.violations
    assert verdict.rejected == 1 and verdict.max_overlap < 0.01
    # The same acts without the freeze are two leaders at once for 2 s.
    assert [v.kind for v in check(_history(acts)).violations] == ["overlap"]


# --- the shards workload: every name an election of its own --------------------------------------------------


def _named(acts: list[Act], name: str) -> list[Act]:
    return [Act(a.who, a.token, a.t0, a.t1, a.ok, name) for a in acts]


def _shards_history(acts: list[Act], names: list[str], *, end: float | None = None) -> History:
    """``acts`` as the per-name fenced register would have taken them (a row per name)."""
    judged: list[Act] = []
    writes: list[Write] = []
    highest: dict[str, int] = {}
    for act in sorted(acts, key=lambda a: a.t0):
        ok = (act.token or 0) >= highest.get(act.name, 0)
        judged.append(Act(act.who, act.token, act.t0, act.t1, ok, act.name))
        if ok:
            highest[act.name] = act.token or 0
            writes.append(Write(len(writes), act.token or 0, act.who, act.t0, f"shards/{act.name}"))
    return History(
        label="shards",
        acts=judged,
        writes=writes,
        faults=[],
        begin=0,
        end=int(end * NS) if end is not None else int(max(a.t0 for a in acts)) + NS // 10,
        margin=0.9,
        base_gap=3.0,
        names=names,
    )


def _two_names() -> list[Act]:
    """c1 owns s0 and c2 owns s1 at once (no overlap: different names); s0 moves to c2 at 10 s, tokens per name."""
    return _named(_leader("c1", 3, 0.0, 9.9) + _leader("c2", 7, 10.2, 20.0), "s0") + _named(
        _leader("c2", 4, 0.0, 20.0), "s1"
    )


def test_shards_checker_passes_names_owned_at_once_by_different_candidates() -> None:
    verdict = check(_shards_history(_two_names(), ["s0", "s1"]))
    assert verdict.ok, verdict.violations
    assert sorted((t.name, t.who, t.token) for t in verdict.terms) == [
        ("s0", "c1", 3),
        ("s0", "c2", 7),
        ("s1", "c2", 4),
    ]
    # The same acts as one election: two candidates acting at once for 10 s.
    history = _shards_history(_two_names(), ["s0", "s1"])
    history.names = []
    assert "overlap" in {v.kind for v in check(history).violations}


def test_shards_checker_reports_a_lower_token_accepted_for_one_name() -> None:
    history = _shards_history(_two_names(), ["s0", "s1"])
    # c1's token 3 accepted on s0's row after c2's token 7; token 3 on s1's row would be another row's order.
    history.writes.append(Write(len(history.writes), 3, "c1", 12 * NS, "shards/s0"))
    verdict = check(history)
    assert [v.kind for v in verdict.violations] == ["token"]
    assert verdict.violations[0].message.startswith("s0: ") and "token 3 after write" in verdict.violations[0].message


def test_shards_checker_reports_a_name_led_again_with_a_smaller_token() -> None:
    acts = _two_names() + _named(_leader("c2", 7, 20.04, 25.0), "s0") + _named(_leader("c3", 2, 21.0, 25.0), "s1")
    # s1: c3 leads with token 2 after c2's token 4 (the register refuses its writes)
    verdict = check(_shards_history(acts, ["s0", "s1"]))
    assert {v.kind for v in verdict.violations} == {"token"}
    assert any(v.message.startswith("s1: ") and "not larger" in v.message for v in verdict.violations)


def test_shards_checker_reports_two_owners_of_one_name_beyond_the_margin() -> None:
    acts = _two_names() + _named(_leader("c3", 9, 18.5, 20.0), "s1")  # c2 and c3 both act on s1 for 1.5 s
    verdict = check(_shards_history(acts, ["s0", "s1"]))
    assert [v.kind for v in verdict.violations] == ["overlap"]
    assert verdict.violations[0].message.startswith("s1: c2 (token 4) and c3 (token 9)")
    assert verdict.max_overlap == pytest.approx(1.5, abs=0.05)


def test_shards_checker_reports_a_name_nobody_owns_at_the_end() -> None:
    acts = _named(_leader("c1", 3, 0.0, 30.0), "s0") + _named(_leader("c2", 4, 0.0, 20.0), "s1")
    verdict = check(_shards_history(acts, ["s0", "s1", "s2"]))
    assert sorted(v.message.split(":")[0] for v in verdict.violations if v.kind == "gap") == ["s1", "s2"]
    assert any("nobody ever led" in v.message for v in verdict.violations)


SHARDS_SOAK_SECONDS = 30


@pytest.mark.timeout(SHARDS_SOAK_SECONDS + 150)
def test_short_shards_soak_passes(tmp_path: Path) -> None:
    """The shards workload (aioelect.Shards over 12 names, a register row per name) on etcd and PostgreSQL.

    30 s leave room for three or four faults; the seed is one whose schedule has a kill on both backends, a
    pause and a depose on etcd, a join and a depose on PostgreSQL.
    """
    _require_servers()
    argv = ["-m", "soak", "--shards", "--minutes", str(SHARDS_SOAK_SECONDS / 60), "--seed", "20264034"]
    proc = subprocess.run(
        [sys.executable, *argv, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SHARDS_SOAK_SECONDS + 140,
    )
    report = (tmp_path / "report.md").read_text() if (tmp_path / "report.md").exists() else "(no report)"
    assert proc.returncode == 0, (
        f"soak failed (status {proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
    )
    for label in SHARDS_LABELS:
        assert f"| {label} | pass |" in report
        faults = [json.loads(line) for line in (tmp_path / label / "faults.jsonl").read_text().splitlines()]
        assert faults, f"{label}: no fault injected"
        events = [
            json.loads(line) for path in (tmp_path / label).glob("c*.jsonl") for line in path.read_text().splitlines()
        ]
        owned = {e["name"] for e in events if e["e"] == "act" and e["ok"]}
        assert owned == set(SHARD_NAMES), f"{label}: names never written: {set(SHARD_NAMES) - owned}"
    print(report)


SPLITS_SOAK_SECONDS = 45


@pytest.mark.timeout(SPLITS_SOAK_SECONDS + 150)
def test_short_splits_soak_passes(tmp_path: Path) -> None:
    """The split workload (soak/splits.py): server nodes in network namespaces split from each other.

    The seed's schedule cuts the Sentinel group's master off from its replicas and then from its sentinels,
    isolates the raft leader's member of the three-member etcd, and crash-loops a node of each, beside deposes.
    """
    _require_servers()
    argv = ["-m", "soak", "--splits", "--minutes", str(SPLITS_SOAK_SECONDS / 60), "--seed", "20260050"]
    proc = subprocess.run(
        [sys.executable, *argv, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SPLITS_SOAK_SECONDS + 140,
    )
    report = (tmp_path / "report.md").read_text() if (tmp_path / "report.md").exists() else "(no report)"
    assert proc.returncode == 0, (
        f"soak failed (status {proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
    )
    splits = {
        "sentinel-split": {"cut-sentinels", "cut-replicas", "crash-loop"},
        "etcd3-split": {"isolate", "crash-loop"},
    }
    for label, kinds in splits.items():
        assert f"| {label} | pass |" in report
        faults = [json.loads(line) for line in (tmp_path / label / "faults.jsonl").read_text().splitlines()]
        assert kinds <= {f["kind"] for f in faults}, f"{label}: {[f['kind'] for f in faults]}"
    cut = next(f for f in faults_of(tmp_path, "sentinel-split") if f["kind"] == "cut-sentinels")
    assert "(failed over)" in cut["detail"], cut  # the sentinels promoted a replica under the leader
    print(report)


def faults_of(out: Path, label: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (out / label / "faults.jsonl").read_text().splitlines()]
