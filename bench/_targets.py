"""The Targets table of RESULTS.md: each of aioelect's targets, its verdict, and the best peer on the same row."""

from __future__ import annotations

import math
from typing import Any

from ._numbers import INF, fmt_s, idle_block, median, requests, samples, versus
from ._report_scale import rtt_of

__all__ = ["targets"]


def best_peer(data: dict[str, Any], backend: str, scenario: str) -> tuple[str, float]:
    best = ("", math.nan)
    for key, meta in data["impls"].items():
        if meta["ours"] or meta["backend"] != backend:
            continue
        o = data["results"].get(key, {}).get(scenario)
        if not o or not samples(o):
            continue
        med = median(samples(o))
        if math.isnan(best[1]) or med < best[1]:
            best = (meta["label"], med)
    return best


def best_peer_rate(data: dict[str, Any], backend: str) -> tuple[str, float]:
    best = ("", math.nan)
    for key, meta in data["impls"].items():
        if meta["ours"] or meta["backend"] != backend:
            continue
        o = data["results"].get(key, {}).get("handoff")
        if o and o.get("values") and (math.isnan(best[1]) or o["values"][0] > best[1]):
            best = (meta["label"], o["values"][0])
    return best


def _best_idle_peer(data: dict[str, Any], backend: str, size: str) -> tuple[str, float]:
    """The peer with the fewest server requests per waiting candidate in the idle scenario, and that rate."""
    best = ("", math.nan)
    for key, meta in data["impls"].items():
        if meta["ours"] or meta["backend"] != backend:
            continue
        block = idle_block(data["results"].get(key, {}).get("idle"), size)
        if block is None:
            continue
        rate = max(requests(backend, block["per_candidate"]), 0.0)
        if math.isnan(best[1]) or rate < best[1]:
            best = (meta["label"], rate)
    return best


def targets(data: dict[str, Any]) -> list[str]:
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
            med = median(samples(r["graceful"]))
            peer, pm = best_peer(data, be, "graceful")
            ok = None if math.isnan(med) else med <= 0.020
            add(
                "graceful handover ≤ 20 ms median",
                label,
                fmt_s(med),
                ok,
                versus(med, peer, pm),
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
            elif be == "file":
                add("graceful handover ≤ 3 round trips", label, "no server, no round trip to count in", None)
        # 2. crash
        if "crash" in r:
            med = median(samples(r["crash"]))
            bound = {"mysql": 0.100, "etcd": 5.5, "redis": 5.5}.get(be)
            peer, pm = best_peer(data, be, "crash")
            ok = None if bound is None or math.isnan(med) else med <= bound
            name = {
                "mysql": "crash takeover ≤ 100 ms median",
                "etcd": "crash takeover ≤ TTL + 0.5 s (5.5 s)",
                "redis": "crash takeover ≤ lease + 0.5 s (5.5 s)",
            }.get(be, "crash takeover (no target)")
            add(
                name,
                label,
                fmt_s(med),
                ok,
                versus(med, peer, pm),
                f"by {fmt_s(med - bound)}" if ok is False and bound is not None else "",
                not_slower(med, pm),
            )
        # 3. frozen
        if "frozen" in r and not r["frozen"].get("skipped"):
            o = r["frozen"]
            xs = samples(o)
            mx = xs[-1] if xs else math.nan
            bound = 6.0 if be in ("mysql", "etcd", "postgres", "redis") else None
            peer, pm = best_peer(data, be, "frozen")
            ok = None if bound is None or math.isnan(mx) else mx <= bound
            add(
                "frozen leader replaced within lease + 1 s (6 s), every time",
                label,
                f"median {fmt_s(median(xs))}, max {fmt_s(mx)}",
                ok,
                versus(median(xs), peer, pm),
                f"max by {fmt_s(mx - bound)}" if ok is False and bound is not None and mx != INF else "",
                not_slower(median(xs), pm),
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
            xs = samples(r["deposed"])
            mx = xs[-1] if xs else math.nan
            peer, pm = best_peer(data, be, "deposed")
            ok = None if math.isnan(mx) else mx <= 3.0
            add(
                "deposed leader stops within check_interval + timeout (3 s), every time",
                label,
                f"median {fmt_s(median(xs))}, max {fmt_s(mx)}",
                ok,
                versus(median(xs), peer, pm),
                no_worse=not_slower(median(xs), pm),
            )
        # 5. idle
        if "idle" in r:
            for size in (small, large):
                block = idle_block(r["idle"], size)
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
                        f"idle x{size}: ≤ 1 lock wait per poll interval and 1 leader look per max(poll interval, 1 s)"
                        " (1.0/s) each, no new connections",
                        label,
                        f"{q:.2f} queries/s per candidate, {conns:.2f} new connections/s",
                        # 2 % for where the windows' edges fall between two polls.
                        q <= 1.02 and conns < 0.05,
                    )
                elif be == "redis":
                    cmds = per.get("total_commands_processed", 0.0)
                    tries = per.get("cmd:evalsha", 0.0) + per.get("cmd:eval", 0.0)
                    conns = block["rates"].get("total_connections_received", 0.0)
                    peer_key, peer_rate = _best_idle_peer(data, be, size)
                    add(
                        f"idle x{size}: ≤ 1 try per poll interval (1.0/s) each, no new connections",
                        label,
                        f"{tries:.2f} tries/s ({cmds:.2f} commands/s) per candidate, {conns:.2f} new connections/s",
                        # 2 % for where the windows' edges fall between two tries.
                        tries <= 1.02 and conns < 0.05,
                        f"{peer_key}: {peer_rate:.2f} commands/s" if peer_key else "",
                        no_worse=None if not peer_key else cmds <= peer_rate,
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
            peer, pr = best_peer_rate(data, be)
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
            med = median(r["coldstart"]["values"])
            peer, pm = best_peer(data, be, "coldstart")
            add(
                "cold start: new elector to leading (no target)",
                label,
                fmt_s(med),
                None,
                versus(med, peer, pm),
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
