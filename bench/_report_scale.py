"""The parts of RESULTS.md about cost: round trips, cold start, scale (and scale.png)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ._numbers import fmt_s, md_table, median, requests, samples

__all__ = ["coldstart_section", "rtt_of", "rtt_section", "scale_chart", "scale_section"]


def rtt_of(data: dict[str, Any], backend: str) -> tuple[str, float]:
    """The round trip a backend's latencies are counted in: (what was timed, median seconds)."""
    for key, meta in data["impls"].items():
        if meta["backend"] != backend or not meta["ours"]:
            continue
        m = data["results"].get(key, {}).get("rtt", {}).get("metrics", {})
        if backend == "etcd" and "Put" in m:
            return "Put", float(m["Put"]["median"])
        if backend == "redis" and "PING" in m:
            return "PING", float(m["PING"]["median"])
        if "SELECT 1" in m:
            return "SELECT 1", float(m["SELECT 1"]["median"])
    return "", math.nan


def _times(x: float, unit: float) -> str:
    if math.isnan(x) or math.isnan(unit) or unit <= 0:
        return "-"
    if x == math.inf:
        return "never"
    return f"{x / unit:.1f}x"


def rtt_section(data: dict[str, Any]) -> list[str]:
    """Each latency as a multiple of its backend's round trip, measured in the same run."""
    units = []
    for backend in ("mysql", "etcd", "postgres", "redis"):
        for key, meta in data["impls"].items():
            m = data["results"].get(key, {}).get("rtt", {}).get("metrics")
            if meta["backend"] == backend and meta["ours"] and m:
                parts = [
                    f"{what} {fmt_s(v['median'])} (p10 {fmt_s(v['p10'])}, p90 {fmt_s(v['p90'])})"
                    for what, v in m.items()
                ]
                units.append(f"- **{backend}**: " + "; ".join(parts))
    lines = [
        "### In server round trips",
        "",
        "One round trip per backend, measured in the same run on one open connection (median of"
        f" {data.get('settings', {}).get('rtt_count', 200)}, after a warm-up): `SELECT 1` through aiomysql and"
        " asyncpg, and beside it a durable commit (an autocommitted one-row upsert: InnoDB flushes its log,"
        " PostgreSQL runs with `synchronous_commit=on`, as a fencing token's commit does); on etcd a"
        " linearizable `Range` and a `Put` over grpc-aio with the API messages aioelect uses. SQL multiples"
        " are counted in `SELECT 1` round trips. A handover on etcd includes a write (the release's delete,"
        " fsynced), so etcd's multiples are counted in `Put` round trips. On Redis a `PING` and a `SET` (fsynced"
        " before its reply: `appendfsync always`) through redis-py's asyncio client; Redis multiples are counted in"
        " `PING` round trips. *In one process*: two candidates in one"
        " process (`python -m bench.probes inproc`), the leader releases while the other waits: no process has to"
        " be woken, and both sides share one event loop, so their work adds up instead of overlapping; in"
        " brackets the leader's `release()` alone, from its call to its return.",
        "",
        *units,
        "",
    ]
    rows = []
    for key, meta in data["impls"].items():
        be = meta["backend"]
        if be == "file":
            continue
        what, unit = rtt_of(data, be)
        r = data["results"].get(key, {})
        if not r:
            continue
        crash = median(samples(r["crash"])) if "crash" in r else math.nan
        crash_cell = _times(crash, unit) if crash < 1.0 else f"{fmt_s(crash)}: lease or poll bound"
        ho = r.get("handoff", {})
        per_leadership = math.nan
        if ho.get("metrics", {}).get("leaderships"):
            per_leadership = ho["metrics"]["seconds"] / ho["metrics"]["leaderships"]
        cold = median(r["coldstart"]["values"]) if r.get("coldstart", {}).get("values") else math.nan
        one = r.get("inproc", {})
        one_cell = "-"
        if one.get("values"):
            rel = one.get("metrics", {}).get("release") or [math.nan]
            one_cell = (
                f"{fmt_s(median(one['values']))} = {_times(median(one['values']), unit)}"
                f" ({fmt_s(median(rel))} = {_times(median(rel), unit)})"
            )
        rows.append(
            [
                f"**{meta['label']}**" if meta["ours"] else meta["label"],
                f"{what} {fmt_s(unit)}" if what else "-",
                _times(median(samples(r["graceful"])) if "graceful" in r else math.nan, unit),
                one_cell,
                crash_cell if "crash" in r else "-",
                _times(per_leadership, unit),
                _times(cold, unit),
            ]
        )
    lines += md_table(
        [
            "Implementation",
            "Round trip (median)",
            "Graceful handover",
            "The same in one process (release() alone)",
            "Crash takeover",
            "One leadership in the handoff run",
            "Cold start",
        ],
        rows,
    )
    return lines


def coldstart_section(data: dict[str, Any]) -> list[str]:
    """Time from a new candidate's construction to its leading an empty election."""
    reps = data.get("settings", {}).get("coldstart_reps", 10)
    lines = [
        "### Cold start",
        "",
        "A new candidate in a fresh process-wide state: constructed, connecting and campaigning inside the timing"
        " (`acquire()` on a new elector for aioelect; the peer's client created, connected and its lock taken),"
        f" in an empty election with a fresh name each repetition; {reps} repetitions after one not counted"
        " (lazily imported drivers), one at a time.",
        "",
    ]
    rows = []
    for key, meta in data["impls"].items():
        o = data["results"].get(key, {}).get("coldstart")
        if not o:
            continue
        xs = sorted(o.get("values", []))
        errs = o.get("errors", [])
        rows.append(
            [
                f"**{meta['label']}**" if meta["ours"] else meta["label"],
                fmt_s(median(xs)) if xs else "-",
                fmt_s(xs[-1]) if xs else "-",
                str(len(xs)),
                ("; ".join(errs))[:160] if errs else "",
            ]
        )
    lines += md_table(["Implementation", "Median", "Max", "Repetitions", "Errors"], rows)
    return lines


def _scale_rows(data: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for key in data["impls"]:
        o = data["results"].get(key, {}).get("scale")
        if not o:
            continue
        for n, row in sorted(o.get("metrics", {}).items(), key=lambda kv: int(kv[0])):
            out.append((key, n, row))
    return out


def _elections(n: str, row: dict[str, Any]) -> int:
    """What a scale row's totals are divided by: N, or for an N not reached the elections that had a leader."""
    return max(int(row.get("led", n)), 1) if row.get("limit") else int(n)


def _per(x: float, n: int, digits: int = 3) -> str:
    """``x / n`` to ``digits`` significant digits (per-election values span several orders of magnitude)."""
    return f"{x / n:.{digits}g}"


def scale_section(data: dict[str, Any]) -> list[str]:
    """The scale table: per election, at each N."""
    s = data.get("settings", {})
    lines = [
        "### Scale: elections per process",
        "",
        f"N elections at once, held by 3 candidate processes each campaigning in every election (3N candidates);"
        f" slots start in batches of {s.get('scale_batch', 50)} per process. Measured over"
        f" {s.get('scale_window', 6):g} s once every election has a leader, on servers of their own (MariaDB"
        " and PostgreSQL with raised `max_connections`). **Per election**: server requests/s (MariaDB"
        " `Questions`; PostgreSQL `pg_stat_statements` calls, which count a statement when it ends; etcd"
        " `grpc_server_msg_received_total`), connections the server holds (client-side count in brackets),"
        " etcd leases, watch streams and watchers; client CPU (% of a core) and memory (PSS) of the 3 processes;"
        " the server's memory (PSS, with its children: PostgreSQL's per-session processes)."
        " Handover: a few elections' leaders (first, middle, last) release; time to that election's next"
        " LEADER. An N not reached is counted per election that had a leader. *Load average*: the machine's"
        " 1-minute load at the end of the window (2 cores): above 2, the candidates wait for a core.",
        "",
        "The chart is [scale.png](scale.png).",
        "",
        "![scale](scale.png)",
        "",
    ]
    m = data.get("machine", {})
    if "nofile_hard" in m:
        caps = ", ".join(f"{k} {v}" for k, v in m.get("scale_max_connections", {}).items())
        lines += [
            f"Limits set for this scenario: `max_connections` {caps}; each candidate process raises its"
            f" descriptor limit (`RLIMIT_NOFILE`) to the hard limit, {m['nofile_hard']} here.",
            "",
        ]
    rows = []
    limits = []
    for key, n_str, row in _scale_rows(data):
        meta = data["impls"][key]
        be = meta["backend"]
        n = _elections(n_str, row)
        state = row.get("state", {})
        if "rates" not in row:
            continue
        req = "-" if be == "file" else _per(requests(be, row["rates"]), n)
        conns = "-"
        if "connections" in state:
            conns = f"{_per(state['connections'], n)} ({_per(row.get('client_connections', 0), n)})"
        elif be == "etcd":
            conns = f"({_per(row.get('client_connections', 0), n)})"
        etcd = "-"
        if be == "etcd":
            etcd = (
                f"{_per(state.get('leases', 0), n)} / {_per(state.get('watch_stream_total', 0), n)}"
                f" / {_per(state.get('watcher_total', 0), n)}"
            )
        ho = sorted(row.get("handover", []))
        ho_cell = f"{fmt_s(median(ho))} / {fmt_s(ho[-1])}" if ho else "-"
        if row.get("handover_missed"):
            ho_cell += f" ({row['handover_missed']} not within 10 s)"
        led = f"{row.get('led', n)} ({row.get('leading_now', n)})"
        load = f"{row['load']:.1f}" if "load" in row else "-"
        rows.append(
            [
                meta["label"],
                n_str,
                led,
                f"{row.get('start_s', 0):.1f} s",
                req,
                conns,
                etcd,
                _per(row["cpu_pct"], n),
                _per(row["mem_mib"], n),
                _per(row["server_mem_mib"], n) if "server_mem_mib" in row else "-",
                ho_cell,
                str(row.get("errors", 0)),
                load,
            ]
        )
        if row.get("limit"):
            limits.append(f"- {meta['label']}, N={n_str}: {row['limit']}")
    for key, meta in data["impls"].items():
        o = data["results"].get(key, {}).get("scale")
        for err in (o or {}).get("errors", []):
            limits.append(f"- {meta['label']}: {err}")
    lines += md_table(
        [
            "Implementation",
            "N",
            "Led (leading after the window)",
            "Start",
            "Requests/s",
            "Connections (client)",
            "etcd leases / watch streams / watchers",
            "Client CPU %",
            "Client MiB",
            "Server MiB",
            "Handover median / max",
            "Errors",
            "Load average",
        ],
        rows,
    )
    if limits:
        lines += ["", "Where an N was not reached:", "", *limits]
    return lines


def scale_chart(data: dict[str, Any], path: Path) -> None:
    """scale.png: the per-election costs and the handover latency against N (log x)."""
    rows = _scale_rows(data)
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("Server requests/s per election", lambda be, r, n: requests(be, r["rates"]) / n if be != "file" else None),
        (
            "Server connections per election",
            lambda be, r, n: (
                r.get("state", {}).get("connections", r.get("client_connections", math.nan)) / n
                if be != "file"
                else None
            ),
        ),
        ("Client CPU per election (% of a core)", lambda be, r, n: r["cpu_pct"] / n),
        ("Client memory per election (MiB PSS)", lambda be, r, n: r["mem_mib"] / n),
        (
            "Graceful handover, median (ms)",
            lambda be, r, n: 1000 * median(r["handover"]) if r.get("handover") else None,
        ),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    keys = sorted({k for k, _, _ in rows}, key=list(data["impls"]).index)
    for ax, (title, fn) in zip(axes, panels, strict=True):
        for key in keys:
            meta = data["impls"][key]
            pts = []
            for k, n_str, r in rows:
                if k != key or "rates" not in r:
                    continue
                y = fn(meta["backend"], r, _elections(n_str, r))
                if y is not None and not math.isnan(y) and y > 0:
                    pts.append((int(n_str), y))
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o", label=meta["label"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("elections N (3 processes)")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[3].get_legend_handles_labels()  # memory: every implementation has a point
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
