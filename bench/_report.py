"""RESULTS.md and takeover.png from one run's results (``bench/out/results.json``)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

__all__ = ["write_report"]

INF = math.inf
LATENCY = ("graceful", "crash", "frozen", "deposed")
TITLES = {
    "graceful": "1. Graceful handover",
    "crash": "2. Crash (SIGKILL)",
    "frozen": "3. Frozen (SIGSTOP): takeover",
    "overlap": "3. Frozen: acts after wake-up",
    "deposed": "4. Deposed: stops acting",
    "idle": "5. Idle x{n}: requests/s per candidate",
    "idle_cpu": "5. Idle x{n}: client CPU",
    "handoff": "6. Handoffs/s (releaser re-won)",
}


# --- numbers ------------------------------------------------------------------------


def _samples(o: dict[str, Any]) -> list[float]:
    """Every repetition, a 'never' counted as infinitely long."""
    return sorted([*o.get("values", []), *([INF] * int(o.get("never", 0)))])


def _median(xs: list[float]) -> float:
    if not xs:
        return math.nan
    xs = sorted(xs)
    mid = len(xs) // 2
    if len(xs) % 2:
        return xs[mid]
    lo, hi = xs[mid - 1], xs[mid]
    return INF if INF in (lo, hi) else (lo + hi) / 2


def fmt_s(x: float) -> str:
    """Seconds, readable: 850 µs, 12.3 ms, 4.41 s."""
    if math.isnan(x):
        return "-"
    if x == INF:
        return "never"
    if x < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if x < 0.1:
        return f"{x * 1e3:.1f} ms"
    if x < 1:
        return f"{x * 1e3:.0f} ms"
    if x < 100:
        return f"{x:.2f} s"
    return f"{x:.0f} s"


def fmt_w(window: float) -> str:
    """An observation window."""
    return f"{window:g} s"


def _versus(ours: float, peer: str, best: float) -> str:
    """How our median compares with the best peer's: 'N.Nx faster than PEER (its median)'."""
    if not peer or math.isnan(ours) or math.isnan(best):
        return ""
    if best == INF:
        return "every peer: never" if ours != INF else "peers never either"
    if ours == INF:
        return f"{peer}: {fmt_s(best)}"
    if ours <= 0 or best <= 0:
        return f"{peer}: {fmt_s(best)}"
    r = best / ours
    how = f"{r:.1f}x faster" if r >= 1 else f"{1 / r:.1f}x slower"
    return f"{how} than {peer} ({fmt_s(best)})"


def _cell(o: dict[str, Any] | None, window: float) -> str:
    if o is None:
        return "-"
    if o.get("skipped"):
        return "n/a"
    xs = _samples(o)
    if not xs:
        return "error" if o.get("errors") else "-"
    med, mx = _median(xs), xs[-1]
    if med == INF:
        return f"never (> {fmt_w(window)})"
    top = f"never (> {fmt_w(window)})" if mx == INF else fmt_s(mx)
    return f"{fmt_s(med)} / {top}"


def _overlap_cell(o: dict[str, Any] | None) -> str:
    if o is None or o.get("skipped"):
        return "-"
    if not o.get("values"):
        return "n/a (not replaced)"
    acts = o.get("acts_after_wake", [])
    n_never = int(o.get("overlap_never", 0))
    if n_never:
        return f"never stops ({n_never}/{n_never + len(o.get('overlap', []))})"
    ov = o.get("overlap", [])
    if not ov:
        return "-"
    n = sum(acts)
    return f"{fmt_s(max(ov))} max, {n} act{'s' if n != 1 else ''}" if max(ov) > 0 else "0 (no act)"


def _idle_block(o: dict[str, Any] | None, size: str) -> dict[str, Any] | None:
    if o is None:
        return None
    block = o.get("metrics", {}).get(size)
    return block if isinstance(block, dict) else None


def _requests(backend: str, rates: dict[str, float]) -> float:
    """Requests per second to the server, from the counters of one backend."""
    if backend == "mysql":
        return rates.get("Questions", 0.0)
    if backend == "etcd":
        return sum(v for k, v in rates.items() if k.startswith("msgs:"))
    if backend == "postgres":
        return max(rates.get("statements", rates.get("transactions", 0.0)), 0.0)
    return math.nan


def _idle_cell(o: dict[str, Any] | None, size: str, backend: str) -> str:
    block = _idle_block(o, size)
    if block is None:
        return "error" if o and o.get("errors") else "-"
    if backend == "file":
        return "no server"
    per = _requests(backend, block["per_candidate"])
    return f"{max(per, 0.0):.2f}"


def _cpu_cell(o: dict[str, Any] | None, size: str) -> str:
    block = _idle_block(o, size)
    if block is None:
        return "-"
    return f"{block['cpu_pct']:.1f} %"


def _handoff_cell(o: dict[str, Any] | None) -> str:
    if o is None or not o.get("values"):
        return "error" if o and o.get("errors") else "-"
    m = o["metrics"]
    total = max(m["leaderships"] - 1, 1)
    return f"{o['values'][0]:.1f} ({100 * m['repeats'] / total:.0f} %)"


# --- targets -------------------------------------------------------------------------


def _best_peer(data: dict[str, Any], backend: str, scenario: str) -> tuple[str, float]:
    best = ("", math.nan)
    for key, meta in data["impls"].items():
        if meta["ours"] or meta["backend"] != backend:
            continue
        o = data["results"].get(key, {}).get(scenario)
        if not o or not _samples(o):
            continue
        med = _median(_samples(o))
        if math.isnan(best[1]) or med < best[1]:
            best = (meta["label"], med)
    return best


def _best_peer_rate(data: dict[str, Any], backend: str) -> tuple[str, float]:
    best = ("", math.nan)
    for key, meta in data["impls"].items():
        if meta["ours"] or meta["backend"] != backend:
            continue
        o = data["results"].get(key, {}).get("handoff")
        if o and o.get("values") and (math.isnan(best[1]) or o["values"][0] > best[1]):
            best = (meta["label"], o["values"][0])
    return best


def _targets(data: dict[str, Any]) -> list[str]:
    from ._report_scale import rtt_of

    rows: list[str] = []
    results = data["results"]
    settings = data.get("settings", {})
    large = str(settings.get("idle_counts", [20, 100])[-1])
    small = str(settings.get("idle_counts", [20, 100])[0])
    misses: list[str] = []
    behind: list[str] = []

    def add(
        target: str,
        impl: str,
        measured: str,
        ok: bool | None,
        vs: str = "",
        miss: str = "",
        no_worse: bool | None = None,
    ) -> None:
        verdict = "-" if ok is None else ("**met**" if ok else f"**missed**{': ' + miss if miss else ''}")
        peer_verdict = "-" if no_worse is None else ("yes" if no_worse else "**no**")
        rows.append(f"| {target} | {impl} | {measured} | {verdict} | {vs} | {peer_verdict} |")
        if ok is False:
            misses.append(f"{target} ({impl})")
        if no_worse is False:
            behind.append(f"{target.split(':')[0].split(' ≤')[0]} ({impl})")

    def not_slower(ours: float, best: float) -> bool | None:
        if math.isnan(ours) or math.isnan(best):
            return None
        return ours <= best

    for key, meta in data["impls"].items():
        if not meta["ours"] or key not in results:
            continue
        r = results[key]
        be = meta["backend"]
        label = meta["label"]
        # 1. graceful handover
        if "graceful" in r:
            med = _median(_samples(r["graceful"]))
            peer, pm = _best_peer(data, be, "graceful")
            ok = None if math.isnan(med) else med <= 0.020
            add(
                "graceful handover ≤ 20 ms median",
                label,
                fmt_s(med),
                ok,
                _versus(med, peer, pm),
                f"by {fmt_s(med - 0.020)}" if ok is False else "",
                not_slower(med, pm),
            )
            what, unit = rtt_of(data, be)
            if what:
                ok_rt = None if math.isnan(med) else med <= 3 * unit
                add(
                    f"graceful handover ≤ 3 round trips ({what})",
                    label,
                    f"{med / unit:.1f} x {fmt_s(unit)}",
                    ok_rt,
                    miss=f"{med / unit - 3:.1f} round trips over" if ok_rt is False else "",
                )
        # 2. crash
        if "crash" in r:
            med = _median(_samples(r["crash"]))
            bound = {"mysql": 0.100, "etcd": 5.5}.get(be)
            peer, pm = _best_peer(data, be, "crash")
            ok = None if bound is None or math.isnan(med) else med <= bound
            name = {"mysql": "crash takeover ≤ 100 ms median", "etcd": "crash takeover ≤ TTL + 0.5 s (5.5 s)"}.get(
                be, "crash takeover (no target)"
            )
            add(
                name,
                label,
                fmt_s(med),
                ok,
                _versus(med, peer, pm),
                f"by {fmt_s(med - bound)}" if ok is False and bound is not None else "",
                not_slower(med, pm),
            )
        # 3. frozen
        if "frozen" in r and not r["frozen"].get("skipped"):
            o = r["frozen"]
            xs = _samples(o)
            mx = xs[-1] if xs else math.nan
            bound = 6.0 if be in ("mysql", "etcd", "postgres") else None
            peer, pm = _best_peer(data, be, "frozen")
            ok = None if bound is None or math.isnan(mx) else mx <= bound
            add(
                "frozen leader replaced within lease + 1 s (6 s), every time",
                label,
                f"median {fmt_s(_median(xs))}, max {fmt_s(mx)}",
                ok,
                _versus(_median(xs), peer, pm),
                f"max by {fmt_s(mx - bound)}" if ok is False and bound is not None and mx != INF else "",
                not_slower(_median(xs), pm),
            )
            acts = sum(o.get("acts_after_wake", []))
            ok2 = None if not o.get("values") else (acts == 0 and not o.get("overlap_never"))
            add(
                "zero leader work after the frozen leader wakes",
                label,
                f"{acts} acts after wake-up in {len(o.get('acts_after_wake', []))} wake-ups",
                ok2,
            )
        # 4. deposed
        if "deposed" in r and not r["deposed"].get("skipped"):
            xs = _samples(r["deposed"])
            mx = xs[-1] if xs else math.nan
            peer, pm = _best_peer(data, be, "deposed")
            ok = None if math.isnan(mx) else mx <= 3.0
            add(
                "deposed leader stops within check_interval + timeout (3 s), every time",
                label,
                f"median {fmt_s(_median(xs))}, max {fmt_s(mx)}",
                ok,
                _versus(_median(xs), peer, pm),
                no_worse=not_slower(_median(xs), pm),
            )
        # 5. idle
        if "idle" in r:
            for size in (small, large):
                block = _idle_block(r["idle"], size)
                if block is None:
                    continue
                per = block["per_candidate"]
                if be == "etcd":
                    rng = per.get("msgs:Range", 0.0)
                    ka = per.get("msgs:LeaseKeepAlive", 0.0)
                    add(
                        f"idle x{size}: no range requests, keep-alives only at TTL/3 (≤ 0.6/s each)",
                        label,
                        f"Range {rng:.3f}/s, LeaseKeepAlive {ka:.2f}/s per candidate",
                        rng <= 0.01 and ka <= 0.65,
                    )
                elif be == "mysql":
                    q = per.get("Questions", 0.0)
                    conns = block["rates"].get("Connections", 0.0)
                    add(
                        f"idle x{size}: ≤ 1 query per poll interval (0.5/s) each, no new connections",
                        label,
                        f"{q:.2f} queries/s per candidate, {conns:.2f} new connections/s",
                        # 2 % for where the windows' edges fall between two polls.
                        q <= 0.51 and conns < 0.05,
                    )
                if size == large:
                    add(
                        f"idle x{size} in one process: < 2 % of a core",
                        label,
                        f"{block['cpu_pct']:.2f} %",
                        block["cpu_pct"] < 2.0,
                    )
        # 6. handoff
        if "handoff" in r and r["handoff"].get("values"):
            o = r["handoff"]
            rate = o["values"][0]
            m = o["metrics"]
            share = m["repeats"] / max(m["leaderships"] - 1, 1)
            peer, pr = _best_peer_rate(data, be)
            add(
                "≥ 100 handoffs/s, real handoffs",
                label,
                f"{rate:.0f}/s; releaser re-won {100 * share:.0f} % of leaderships",
                rate >= 100,
                f"{rate / pr:.1f}x {peer} ({pr:.1f}/s)" if peer and pr else "",
                f"by {100 - rate:.0f}/s" if rate < 100 else "",
                None if not peer or math.isnan(pr) else rate >= pr,
            )
        # Cold start (no target of its own: compared with the peers)
        if r.get("coldstart", {}).get("values"):
            med = _median(r["coldstart"]["values"])
            peer, pm = _best_peer(data, be, "coldstart")
            add(
                "cold start: new elector to leading (no target)",
                label,
                fmt_s(med),
                None,
                _versus(med, peer, pm),
                no_worse=not_slower(med, pm),
            )
    out = [
        "| Target | Implementation | Measured | Verdict | Against the best peer (same backend) |"
        " No worse than the best peer on this row (same run) |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
    if misses:
        out += ["", "Missed: " + "; ".join(misses) + ". Why, and what would fix it, is in the next section."]
    if behind:
        out += [
            "",
            "A peer is faster on: " + "; ".join(behind) + ". The guarantee that explains each gap is in the next"
            " section.",
        ]
    return out


# --- chart ---------------------------------------------------------------------------------


def _chart(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in data["impls"] if k in data["results"]]
    panels = [("graceful", "Graceful handover"), ("crash", "Crash (SIGKILL)"), ("frozen", "Frozen leader (SIGSTOP)")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 0.42 * len(keys) + 1.8), sharey=True)
    ys = list(range(len(keys)))[::-1]
    for ax, (scenario, title) in zip(axes, panels, strict=True):
        for y, key in zip(ys, keys, strict=True):
            meta = data["impls"][key]
            o = data["results"][key].get(scenario)
            color = "#c0392b" if meta["ours"] else "#34495e"
            if not o or o.get("skipped"):
                continue
            vals = [v for v in o.get("values", []) if v > 0]
            if vals:
                ax.scatter(vals, [y] * len(vals), s=18, color=color, alpha=0.6, zorder=3)
            xs = _samples(o)
            if xs:
                med = _median(xs)
                window = float(o.get("window") or meta.get("takeover_window", 10))
                if med != INF:
                    ax.scatter([med], [y], s=140, marker="|", color=color, linewidths=2.5, zorder=4)
                    ax.annotate(
                        fmt_s(med),
                        (med, y),
                        xytext=(0, 7),
                        textcoords="offset points",
                        ha="center",
                        fontsize=7,
                        color=color,
                    )
                if o.get("never"):
                    ax.scatter([window], [y], s=60, marker=">", color=color, zorder=4)
                    ax.annotate(
                        f"never (> {fmt_w(window)})",
                        (window, y),
                        xytext=(-6, 6),
                        textcoords="offset points",
                        ha="right",
                        fontsize=7,
                        color=color,
                    )
        # A thin line between backends.
        for y, (a, b) in zip(ys, itertools.pairwise(keys), strict=False):
            if data["impls"][a]["backend"] != data["impls"][b]["backend"]:
                ax.axhline(y - 0.5, color="#999999", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlim(5e-4, 150)
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("seconds (log scale)")
        ax.grid(True, axis="x", which="major", alpha=0.3)
        for ref in (0.02, 0.1, 1, 10):
            ax.axvline(ref, color="#bbbbbb", lw=0.6, ls=":", zorder=1)
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels([data["impls"][k]["label"] for k in keys], fontsize=9)
    for tick, key in zip(axes[0].get_yticklabels(), keys, strict=True):
        if data["impls"][key]["ours"]:
            tick.set_color("#c0392b")
            tick.set_fontweight("bold")
    fig.suptitle(
        "Takeover latency per implementation (dots: repetitions, bar: median, ▶: never within the window); "
        "aioelect in red",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the file ------------------------------------------------------------------------------------------


def _per_handoff(backend: str, m: dict[str, Any]) -> str:
    """Server requests per leadership during the handoff run, and the main kinds for etcd."""
    req = m.get("requests")
    if not req or not m.get("leaderships") or backend == "file":
        return "-"
    n = m["leaderships"]
    total = _requests(backend, req)
    if backend == "etcd":
        kinds = sorted(
            ((v / n, k[5:]) for k, v in req.items() if k.startswith("msgs:") and v / n >= 0.05), reverse=True
        )
        return f"{total / n:.1f} (" + ", ".join(f"{name} {v:.1f}" for v, name in kinds) + ")"
    if backend == "mysql":
        return f"{total / n:.1f} ({req.get('Connections', 0) / n:.1f} new connections)"
    return f"{total / n:.1f}"


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def write_report(data: dict[str, Any], where: Path) -> None:
    """Write ``RESULTS.md``, ``takeover.png`` and ``scale.png`` into ``where``."""
    from ._report_scale import coldstart_section, rtt_section, scale_chart, scale_section

    _chart(data, where / "takeover.png")
    scale_chart(data, where / "scale.png")
    settings = data.get("settings", {})
    small, large = (str(x) for x in settings.get("idle_counts", [20, 100]))
    m = data["machine"]
    lines = [
        "# aioelect benchmark results",
        "",
        "Generated by `python -m bench` from one run; do not edit by hand (re-render with"
        " `python -m bench --report-only`).",
        "",
        f"- **Command:** `{data['command']}`"
        + (" (what `make bench` runs)" if data["command"] == "python -m bench" else "")
        + (" — **quick smoke run, not the real numbers**" if data.get("quick") else ""),
        f"- **Date:** {data['started']} (UTC); the run took {data['duration_s']:.0f} s wall"
        + (f" (budget: {data['budget_s']:.0f} s)" if data.get("budget_s") else ""),
        f"- **Machine:** {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}; load average {m['load_before']} before, {m['load_after']} after. The machine is "
        "shared with other work and noisy: read medians and ratios, not single values.",
        "- **Servers** (throwaway, 127.0.0.1, started by the suite with the tests' harness, `tests/harness/`): "
        + ", ".join(f"{k} {v}" for k, v in data.get("servers", {}).items()),
        "- **Libraries:** " + ", ".join(f"{k} {v}" for k, v in data.get("libraries", {}).items()),
        f"- **Repetitions:** {settings.get('reps')} per scenario; {settings.get('candidates')} candidates for"
        " graceful and crash, 2 for frozen and deposed, each a separate OS process.",
        "",
        "![takeover latencies](takeover.png)",
        "",
        "## Results",
        "",
        "Cells are **median / max** over the repetitions. *never (> w)*: the event did not happen within the"
        " observation window w. Idle requests/s are per waiting candidate, the leader's own traffic taken out."
        " Handoffs/s counts only changes of hands; in brackets, how often the releaser won again instead.",
        "",
    ]
    header = [
        "Implementation",
        TITLES["graceful"],
        TITLES["crash"],
        TITLES["frozen"],
        TITLES["overlap"],
        TITLES["deposed"],
        TITLES["idle"].format(n=large),
        TITLES["idle_cpu"].format(n=large),
        TITLES["handoff"],
    ]
    rows = []
    for key, meta in data["impls"].items():
        r = data["results"].get(key)
        label = f"**{meta['label']}**" if meta["ours"] else meta["label"]
        if r is None:
            rows.append([label, *(["not run"] * (len(header) - 1))])
            continue
        rows.append(
            [
                label,
                _cell(r.get("graceful"), float(r.get("graceful", {}).get("window") or 10)),
                _cell(r.get("crash"), meta["takeover_window"]),
                _cell(r.get("frozen"), meta["takeover_window"]),
                _overlap_cell(r.get("frozen")),
                _cell(r.get("deposed"), meta["deposed_window"]),
                _idle_cell(r.get("idle"), large, meta["backend"]),
                _cpu_cell(r.get("idle"), large),
                _handoff_cell(r.get("handoff")),
            ]
        )
    lines += _md_table(header, rows)
    if data.get("unavailable"):
        lines += ["", "Not measured in this run: " + "; ".join(f"{k} ({v})" for k, v in data["unavailable"].items())]

    lines += [
        "",
        "### Idle cost in detail",
        "",
        f"One leader in its own process, then {small} and then {large} waiting candidates in **one** process;"
        " server counters are deltas over the window (MariaDB `SHOW GLOBAL STATUS`, etcd `/metrics`"
        " `grpc_server_msg_received_total` by method, PostgreSQL `pg_stat_statements`), minus what the"
        " leader alone sent; CPU and memory (PSS, the process and its children) are the waiting"
        " candidates' process.",
        "",
    ]
    idle_rows = []
    for key, meta in data["impls"].items():
        o = data["results"].get(key, {}).get("idle")
        for size in (small, large):
            block = _idle_block(o, size)
            if block is None:
                continue
            per = block["per_candidate"]
            rates = block["rates"]
            be = meta["backend"]
            if be == "mysql":
                detail = (
                    f"Questions {per.get('Questions', 0):.2f}, Com_select {per.get('Com_select', 0):.2f};"
                    f" new connections {rates.get('Connections', 0):.2f}/s in all;"
                    f" {block.get('gauges', {}).get('Threads_connected', 0):.0f} connections open"
                )
            elif be == "etcd":
                parts = [f"{k[5:]} {max(v, 0):.3f}" for k, v in per.items() if k.startswith("msgs:") and v >= 0.0005]
                detail = ", ".join(parts) or "none"
            elif be == "postgres" and "statements" in per:
                detail = (
                    f"statements {max(per['statements'], 0):.2f} (`pg_stat_statements`, counted when each ends),"
                    f" new sessions {rates.get('sessions', 0):.2f}/s in all"
                )
            elif be == "postgres":
                detail = (
                    f"transactions {max(per.get('transactions', 0), 0):.2f} (undercounted: PostgreSQL flushes these"
                    " counters at most once a second per session, later for a session that never idles),"
                    f" new sessions {rates.get('sessions', 0):.2f}/s in all"
                )
            else:
                detail = "no server"
            idle_rows.append(
                [
                    meta["label"],
                    size,
                    detail,
                    f"{block['cpu_pct']:.2f} %",
                    f"{block['mem_mib']:.0f} MiB ({block['mem_mib'] / int(size):.2f} per candidate)",
                    str(block.get("errors", 0)),
                ]
            )
    lines += _md_table(
        [
            "Implementation",
            "Waiting",
            "Per candidate per second (server side)",
            "Client CPU (% of a core)",
            "Client memory (PSS)",
            "Errors",
        ],
        idle_rows,
    )

    lines += ["", "### Handoff detail", ""]
    ho_rows = []
    for key, meta in data["impls"].items():
        o = data["results"].get(key, {}).get("handoff")
        if not o or not o.get("metrics"):
            continue
        hm = o["metrics"]
        ho_rows.append(
            [
                meta["label"],
                f"{hm['seconds']:.1f} s",
                str(hm["leaderships"]),
                str(hm["handoffs"]),
                str(hm["repeats"]),
                str(hm["overlaps"]),
                _per_handoff(meta["backend"], hm),
            ]
        )
    lines += _md_table(
        [
            "Implementation",
            "Window",
            "Leaderships",
            "Handoffs (changed hands)",
            "Releaser won again",
            "Overlaps seen by clients",
            "Server requests per leadership",
        ],
        ho_rows,
    )

    lines += ["", *rtt_section(data), "", *coldstart_section(data), "", *scale_section(data)]
    lines += ["", "## Targets", "", *_targets(data)]
    lines += ["", "## Analysis: misses, where a peer is faster, scale", ""]
    lines += _analysis(data)
    lines += ["", "## How it is measured", "", *METHOD, "", "### Implementations", ""]
    lines += _md_table(
        ["Implementation", "Backend", "How it is driven"],
        [[v["label"], v["backend"], v["how"]] for v in data["impls"].values()],
    )
    errors = [
        f"- {data['impls'][k]['label']} / {s}: {'; '.join(o['errors'])[:300]}"
        for k, r in data["results"].items()
        for s, o in r.items()
        if o.get("errors")
    ]
    if errors:
        lines += ["", "### Errors during the run", "", *errors]
    (where / "RESULTS.md").write_text("\n".join(lines) + "\n")


def _analysis(data: dict[str, Any]) -> list[str]:
    """Hand-written explanations of the misses seen in the measured run, kept with the numbers they explain."""
    notes_path = Path(__file__).resolve().parent / "ANALYSIS.md"
    if notes_path.exists():
        return notes_path.read_text().strip().splitlines()
    return ["(no analysis written for this run)"]


METHOD = [
    "Every implementation runs as **separate OS processes** (`bench/candidates/<impl>.py`) that speak one"
    " line protocol on stdout (`LEADER`, `ACT`, `RELEASING`, `STOPPED`... each with `time.monotonic_ns()`:"
    " CLOCK_MONOTONIC is system-wide on Linux, so the driver compares the candidates' stamps with its own)."
    " A candidate *acts as leader* while the check its users would make says it leads, and then prints an"
    " `ACT` line every 20 ms: `Leadership.held` for aioelect (self-fencing included), `lock.acquired` for"
    " tooz, a refresh that still finds the lease for aetcd's Lock, the process being alive for"
    " `etcdctl elect`, and for the baseline port: always, as it never checks again.",
    "",
    "1. **Graceful handover:** the leader is told to release; from its `RELEASING` stamp to the next"
    " `LEADER` stamp of another candidate. The old leader then campaigns again as a follower.",
    "2. **Crash:** SIGKILL to the leader's process (the Go process for etcdctl); from the signal to another"
    " candidate's `LEADER`. A fresh candidate replaces the dead one. Implementations whose takeover waits"
    " for a TTL run their repetitions side by side, each in its own election.",
    "3. **Frozen leader:** SIGSTOP; time until another candidate leads. Then SIGCONT, and every `ACT` the"
    " woken leader prints after the wake-up is leader work done while someone else leads; *never stops*:"
    " still acting when the observation window ended. aioelect's SQL backends run with `lease=5` here (so"
    " the server drops a silent leader after 5 s, as etcd does with TTL 5).",
    "4. **Deposed leader:** MariaDB: `KILL` of the connection that holds the `GET_LOCK` (found with"
    " `IS_USED_LOCK`); etcd: revoke the lease of the oldest leased key under the implementation's prefix;"
    " PostgreSQL: `pg_terminate_backend` of the leader's session holding the advisory lock. Time from the"
    " fault to the leader's `STOPPED` (it stopped acting).",
    "5. **Idle cost:** see the detail table above.",
    "6. **Handoff rate:** two candidates that release the moment they lead and campaign again at once.",
    "",
    "Phases: latency-sensitive scenarios (graceful, sub-second crash, handoff) run one at a time with"
    " nothing else running; TTL- and lease-bound ones (seconds) run several implementations side by side;"
    " idle costs run one implementation per server at a time (server counters are global), the servers"
    " in parallel. Every wait is bounded; candidates die with the driver (`PR_SET_PDEATHSIG`).",
]
