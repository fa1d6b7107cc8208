"""RESULTS.md, takeover.png and scale.png from one run's results (``bench/out/results.json``)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from ._numbers import INF, fmt_s, fmt_w, idle_block, md_table, median, requests, samples
from ._report_scale import coldstart_section, rtt_section, scale_chart, scale_section
from ._targets import targets

__all__ = ["write_report"]

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


def _cell(o: dict[str, Any] | None, window: float) -> str:
    if o is None:
        return "-"
    if o.get("skipped"):
        return "n/a"
    xs = samples(o)
    if not xs:
        return "error" if o.get("errors") else "-"
    med, mx = median(xs), xs[-1]
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


def _idle_cell(o: dict[str, Any] | None, size: str, backend: str) -> str:
    block = idle_block(o, size)
    if block is None:
        return "error" if o and o.get("errors") else "-"
    if backend == "file":
        return "no server"
    per = requests(backend, block["per_candidate"])
    return f"{max(per, 0.0):.2f}"


def _cpu_cell(o: dict[str, Any] | None, size: str) -> str:
    block = idle_block(o, size)
    if block is None:
        return "-"
    return f"{block['cpu_pct']:.1f} %"


def _handoff_cell(o: dict[str, Any] | None) -> str:
    if o is None or not o.get("values"):
        return "error" if o and o.get("errors") else "-"
    m = o["metrics"]
    total = max(m["leaderships"] - 1, 1)
    return f"{o['values'][0]:.1f} ({100 * m['repeats'] / total:.0f} %)"


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
            xs = samples(o)
            if xs:
                med = median(xs)
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
    total = requests(backend, req)
    if backend == "etcd":
        kinds = sorted(
            ((v / n, k[5:]) for k, v in req.items() if k.startswith("msgs:") and v / n >= 0.05), reverse=True
        )
        return f"{total / n:.1f} (" + ", ".join(f"{name} {v:.1f}" for v, name in kinds) + ")"
    if backend == "mysql":
        return f"{total / n:.1f} ({req.get('Connections', 0) / n:.1f} new connections)"
    if backend == "redis":
        kinds = sorted(((v / n, k[4:]) for k, v in req.items() if k.startswith("cmd:") and v / n >= 0.05), reverse=True)
        return f"{total / n:.1f} (" + ", ".join(f"{name.upper()} {v:.1f}" for v, name in kinds) + ")"
    return f"{total / n:.1f}"


def write_report(data: dict[str, Any], where: Path) -> None:
    """Write ``RESULTS.md``, ``takeover.png`` and ``scale.png`` into ``where``."""
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
        LINK_HANDOVERS,
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
    lines += md_table(header, rows)
    if data.get("unavailable"):
        lines += ["", "Not measured in this run: " + "; ".join(f"{k} ({v})" for k, v in data["unavailable"].items())]

    lines += [
        "",
        "### Idle cost in detail",
        "",
        f"One leader in its own process, then {small} and then {large} waiting candidates in **one** process;"
        " server counters are deltas over the window (MariaDB `SHOW GLOBAL STATUS`, etcd `/metrics`"
        " `grpc_server_msg_received_total` by method, PostgreSQL `pg_stat_statements`, Redis `INFO`"
        " `total_commands_processed` and `commandstats`, which count the commands a script runs besides the"
        " script's own `EVALSHA`), minus what the"
        " leader alone sent; CPU and memory (PSS, the process and its children) are the waiting"
        " candidates' process.",
        "",
    ]
    idle_rows = []
    for key, meta in data["impls"].items():
        o = data["results"].get(key, {}).get("idle")
        for size in (small, large):
            block = idle_block(o, size)
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
            elif be == "redis":
                kinds = sorted(
                    ((v, k[4:]) for k, v in per.items() if k.startswith("cmd:") and v >= 0.005), reverse=True
                )
                detail = (
                    f"commands {max(per.get('total_commands_processed', 0), 0):.2f} ("
                    + (", ".join(f"{name.upper()} {v:.2f}" for v, name in kinds) or "none")
                    + f"); new connections {rates.get('total_connections_received', 0):.2f}/s in all;"
                    f" {block.get('gauges', {}).get('connected_clients', 0):.0f} connections open"
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
    lines += md_table(
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
    lines += md_table(
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

    lines += ["", "### Blocked event loop", ""]
    blocked_rows = []
    for key, meta in data["impls"].items():
        o = data["results"].get(key, {}).get("blocked")
        if not o or not o.get("metrics"):
            continue
        bm = o["metrics"]
        kept = bm.get("kept") or []
        blocked_rows.append(
            [
                meta["label"],
                f"{max(kept):g} s" if kept else "none",
                f"{bm['lost_at']:g} s" if bm.get("lost_at") else f"not lost up to {max(kept, default=0):g} s",
            ]
        )
    lines += [
        "The leader blocks its own event loop once (`time.sleep(B)`, 1.5 s after it leads) and must still act 2 s"
        f" after it wakes, with no other leader meanwhile; `B` goes up by {settings.get('block_step', 0.5):g} s"
        f" a step, from {settings.get('block_step', 0.5):g} s to at most {settings.get('block_max', 8.0):g} s (a"
        " fresh pair of candidates per step), until a step loses. The block starts at whatever phase of the renew"
        " cycle 1.5 s falls on: the worst phase, and the arithmetic, are in docs/guarantees.md (A blocked event"
        " loop).",
        "",
    ]
    lines += md_table(["Implementation", "Longest block kept", "First block lost"], blocked_rows)

    lines += ["", *rtt_section(data), "", *coldstart_section(data), "", *scale_section(data)]
    lines += ["", "## Targets", "", *targets(data)]
    lines += ["", "## Analysis: misses, where a peer is faster, scale", ""]
    lines += _analysis(data)
    lines += ["", "## How it is measured", "", *METHOD, "", "### Implementations", ""]
    lines += md_table(
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
    path = where / "RESULTS.md"
    # The sharding and handover sections are written by `python -m bench.shards` and `python -m bench.handovers`,
    # runs of their own (after the sharding section): kept as they are.
    previous = path.read_text() if path.exists() else ""
    kept = previous[previous.index("<!-- shards -->") :] if "<!-- shards -->" in previous else ""
    path.write_text("\n".join(lines) + "\n" + ("\n" + kept if kept else ""))


#: The sections written by runs of their own, after this report: linked from its header.
LINK_HANDOVERS = (
    "- **Planned handovers, releases, crashes and rolling deploys** on every backend: "
    "[their own section](#planned-handovers-releases-crashes-and-rolling-deploys) (`make bench-handovers`)."
)


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
    " tooz, a refresh that still finds the lease for aetcd's Lock and for the Redis locks kept by a refresh"
    " loop (redis-py's Lock, pottery, the redbeat-style loop), acquired and not released for"
    " python-redis-lock (its renewal thread ends silently), the process being alive for"
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
    " PostgreSQL: `pg_terminate_backend` of the leader's session holding the advisory lock; Redis: `DEL` of"
    " the implementation's lock key (as an operator, a `FLUSHDB` or an eviction would). Time from the"
    " fault to the leader's `STOPPED` (it stopped acting).",
    "5. **Idle cost:** see the detail table above.",
    "6. **Handoff rate:** two candidates that release the moment they lead and campaign again at once.",
    "7. **Round trips:** see *In server round trips* above (a worker process, `python -m bench.probes rtt`).",
    "8. **Cold start:** see the cold start table (`python -m bench.probes coldstart`).",
    "9. **Scale:** see the scale table; its servers are its own, and it runs beside the lease-bound scenarios;"
    " the idle costs run alone after both.",
    "",
    "Phases: latency-sensitive scenarios (round trips, graceful, sub-second crash, handoff, cold start) run one"
    " at a time with"
    " nothing else running; TTL- and lease-bound ones (seconds) run several implementations side by side;"
    " idle costs run one implementation per server at a time (server counters are global), the servers"
    " in parallel. Every wait is bounded; candidates die with the driver (`PR_SET_PDEATHSIG`).",
]
