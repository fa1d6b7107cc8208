"""What a soak writes: a text timeline, an SVG picture and a markdown report, from the runs and verdicts."""

from __future__ import annotations

import html
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .checker import Verdict
from .runner import BackendRun
from .targets import checked_kinds
from .timing import SLACK, TIMINGS

__all__ = ["markdown", "summary_lines", "svg", "timeline"]

_NS = 1e9
_KIND_COLOURS = {
    "kill": "#d62728",
    "pause": "#9467bd",
    "depose": "#8c564b",
    "partition-drop": "#ff7f0e",
    "partition-stall": "#e6a000",
    "restart": "#1f77b4",
    "member": "#17becf",
    "slow": "#7f7f7f",
}


def _s(run: BackendRun, t: int) -> float:
    return (t - run.began) / _NS


def timeline(runs: Sequence[BackendRun], verdicts: Sequence[Verdict]) -> str:
    """One line per fault (start, heal), leadership and violation, in time order, per backend."""
    out = []
    for run, verdict in zip(runs, verdicts, strict=True):
        lines: list[tuple[int, str]] = []
        for f in run.history.faults:
            lines.append((f.start, f"fault {f.kind} on {f.target} starts ({f.detail})"))
            if f.heal > f.start:
                lines.append((f.heal, f"fault {f.kind} on {f.target} healed"))
        for t in verdict.terms:
            of = f" {t.name}" if t.name else ""
            lines.append((t.start, f"{t.who} leads{of}, token {t.token}"))
            lines.append((t.end, f"{t.who} acts for the last time{of} under token {t.token} ({t.acts} writes)"))
        for act in run.history.acts:
            if act.ok is not True:
                outcome = "refused (a newer token is stored)" if act.ok is False else "failed"
                of = f" to {act.name}" if act.name else ""
                lines.append((act.t0, f"{act.who} write{of} under token {act.token} {outcome}"))
        for who, event in run.losses:
            of = f" {event['name']}" if event.get("name") else ""
            if event["e"] == "unheld":
                lines.append((event["t"], f"{who} read held False{of} under token {event['token']}: no write"))
            else:
                lines.append((event["t"], f"{who} {event['e']}{of} token {event['token']}: {event.get('reason')}"))
        for v in verdict.violations:
            if v.at is not None:
                lines.append((v.at, f"VIOLATION {v.kind}: {v.message}"))
        out.append(f"== {run.label} ==")
        out += [f"{_s(run, t):9.3f}s  {text}" for t, text in sorted(lines, key=lambda x: x[0])]
        out += [f"   skipped: {s}" for s in run.skipped]
        out += [f"   VIOLATION {v.kind}: {v.message}" for v in verdict.violations if v.at is None]
        out.append("")
    return "\n".join(out)


def svg(runs: Sequence[BackendRun], verdicts: Sequence[Verdict]) -> str:
    """Per backend: a row of faults, then one row per candidate with its leaderships; violations in red."""
    width, left, row, gap = 1400, 70, 14, 28
    seconds = max((_s(r, r.history.end) for r in runs), default=1.0) or 1.0

    def x(run: BackendRun, t: int) -> float:
        return left + max(0.0, _s(run, t)) / seconds * (width - left - 10)

    parts: list[str] = []
    y = 10
    for run, verdict in zip(runs, verdicts, strict=True):
        who = [f"c{i + 1}" for i in range(run.candidates)]
        state = "PASS" if verdict.ok else f"FAIL ({len(verdict.violations)})"
        parts.append(f'<text x="4" y="{y + 10}" font-weight="bold">{run.label} {state}</text>')
        y += gap - 10
        parts.append(f'<text x="4" y="{y + 10}">faults</text>')
        lane_ends = [0.0, 0.0]  # two faults may be in force at once: one lane each
        for f in run.history.faults:
            x0, x1 = x(run, f.start), max(x(run, f.heal), x(run, f.start) + 2)
            lane = 0 if lane_ends[0] <= x0 else 1
            lane_ends[lane] = x1
            tip = html.escape(f"{f.kind} {f.target} {f.detail} at {_s(run, f.start):.2f}s")
            colour = _KIND_COLOURS.get(f.kind, "#000")
            parts.append(
                f'<rect x="{x0:.1f}" y="{y + lane * row // 2}" width="{x1 - x0:.1f}" height="{row // 2 - 1}" '
                f'fill="{colour}"><title>{tip}</title></rect>'
            )
        rows = {w: y + row * (i + 1) for i, w in enumerate(who)}
        for w, ry in rows.items():
            parts.append(f'<text x="4" y="{ry + 10}">{w}</text>')
        for term in verdict.terms:
            x0, x1 = x(run, term.start), max(x(run, term.end), x(run, term.start) + 1)
            colour = "#2ca02c" if (term.token or 0) % 2 else "#1a6e1a"
            tip = html.escape(f"{term.who} token {term.token}: {_s(run, term.start):.2f}-{_s(run, term.end):.2f}s")
            parts.append(
                f'<rect x="{x0:.1f}" y="{rows[term.who]}" width="{x1 - x0:.1f}" height="{row - 2}" '
                f'fill="{colour}"><title>{tip}</title></rect>'
            )
        for f in run.history.faults:  # what was done to a candidate, under its row
            if f.candidate in rows:
                x0, x1 = x(run, f.start), max(x(run, f.heal), x(run, f.start) + 2)
                colour = _KIND_COLOURS.get(f.kind, "#000")
                parts.append(
                    f'<rect x="{x0:.1f}" y="{rows[f.candidate] + row - 4}" width="{x1 - x0:.1f}" height="3" '
                    f'fill="{colour}"><title>{html.escape(f.kind)}</title></rect>'
                )
        bottom = y + row * (len(who) + 1)
        for v in verdict.violations:
            if v.at is not None:
                vx = x(run, v.at)
                parts.append(
                    f'<line x1="{vx:.1f}" y1="{y}" x2="{vx:.1f}" y2="{bottom}" stroke="red" stroke-width="2">'
                    f"<title>{html.escape(v.message)}</title></line>"
                )
        y = bottom + gap
    for tick in range(0, int(seconds) + 1, max(10, int(seconds) // 12 // 10 * 10 or 10)):
        tx = left + tick / seconds * (width - left - 10)
        parts.append(f'<text x="{tx:.1f}" y="{y}" font-size="10">{tick}s</text>')
    legend = " ".join(f'<tspan fill="{c}">&#9632; {k}</tspan>' for k, c in _KIND_COLOURS.items())
    parts.append(f'<text x="4" y="{y + 16}" font-size="11">faults: {legend} | leaderships: green</text>')
    height = y + 26
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="11">\n' + "\n".join(parts) + "\n</svg>\n"
    )


def summary_lines(verdicts: Sequence[Verdict]) -> list[str]:
    """The summary table rows (markdown), one per backend."""
    lines = [
        "| backend | verdict | faults injected | leaderships | writes accepted / refused / failed "
        "| max leaderless (bound) | max overlap (margin) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in verdicts:
        faults = ", ".join(f"{k} {n}" for k, n in sorted(v.faults_by_kind.items())) or "none"
        lines.append(
            f"| {v.label} | {'pass' if v.ok else f'FAIL: {len(v.violations)} violation(s)'} | {faults} "
            f"| {len(v.terms)} | {v.accepted} / {v.rejected} / {v.failed} "
            f"| {v.max_gap:.2f} s ({v.max_gap_bound:.2f} s) | {v.max_overlap:.3f} s ({v.margin:.2f} s) |"
        )
    return lines


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def markdown(seed: int, minutes: float, wall: float, runs: Sequence[BackendRun], verdicts: Sequence[Verdict]) -> str:
    """The report the docs' "Report of the last long run" section takes as it is."""
    ok = all(v.ok for v in verdicts)
    shown = {run.label: TIMINGS[run.label] for run in runs} or TIMINGS
    lines = [
        f"`make soak{' SHARDS=1' if any(r.history.names for r in runs) else ''} SEED={seed} MINUTES={minutes:g}` "
        f"on commit `{_commit()}`: "
        f"**{'passed' if ok else 'FAILED'}** ({wall / 60:.1f} minutes of wall time, the backends side by side).",
        "",
        *summary_lines(verdicts),
        "",
        "Candidates started (first ones and replacements) / faults skipped for want of a free candidate: "
        + ", ".join(f"{r.label} {r.candidates} / {len(r.skipped)}" for r in runs)
        + ".",
        "",
        "Bounds (seconds; a leaderless stretch must end by the anchor plus this, "
        f"{SLACK:g} s of scheduling slack included):",
        "",
        "| fault | " + " | ".join(shown) + " |",
        "| --- | " + " | ".join("---" for _ in shown) + " |",
    ]
    kinds = sorted({k for _, t in shown.values() for k in t.bounds})
    for kind in kinds:
        cells = []
        for label, (_, timing) in shown.items():
            bound = timing.bounds[kind] if kind in checked_kinds(label) else None
            cells.append(f"{bound[0]} + {bound[1]:.1f}" if bound else "—")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    if any(run.history.names for run in runs):
        lines += [
            "",
            "Shards workload (`shards-*`): each name is judged as an election of its own (token order, overlap); "
            "its leaderless time is not bounded during faults (a name also moves when an instance joins or "
            "leaves), but every name must be acted on within the base bound of the end of the run; *max "
            "leaderless* is the longest such idle end over the names.",
        ]
    for run, verdict in zip(runs, verdicts, strict=True):
        if verdict.violations:
            lines += ["", f"Violations on {run.label}:", ""]
            lines += [f"- {v.kind}: {v.message}" for v in verdict.violations[:20]]
            if len(verdict.violations) > 20:
                lines.append(f"- ... and {len(verdict.violations) - 20} more (timeline.txt)")
    return "\n".join(lines) + "\n"


def write_all(
    out: Path, seed: int, minutes: float, wall: float, runs: Sequence[BackendRun], verdicts: Sequence[Verdict]
) -> None:
    (out / "timeline.txt").write_text(f"seed {seed}\n\n" + timeline(runs, verdicts), encoding="utf-8")
    (out / "soak.svg").write_text(svg(runs, verdicts), encoding="utf-8")
    (out / "report.md").write_text(markdown(seed, minutes, wall, runs, verdicts), encoding="utf-8")
