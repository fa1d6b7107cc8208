"""Numbers of one run as RESULTS.md writes them: samples, medians, durations, tables."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["INF", "fmt_s", "fmt_w", "idle_block", "md_table", "median", "requests", "samples", "versus"]

INF = math.inf


def samples(o: dict[str, Any]) -> list[float]:
    """Every repetition, a 'never' counted as infinitely long."""
    return sorted([*o.get("values", []), *([INF] * int(o.get("never", 0)))])


def median(xs: list[float]) -> float:
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


def versus(ours: float, peer: str, best: float) -> str:
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


def idle_block(o: dict[str, Any] | None, size: str) -> dict[str, Any] | None:
    if o is None:
        return None
    block = o.get("metrics", {}).get(size)
    return block if isinstance(block, dict) else None


def requests(backend: str, rates: dict[str, float]) -> float:
    """Requests per second to the server, from the counters of one backend."""
    if backend == "mysql":
        return rates.get("Questions", 0.0)
    if backend == "etcd":
        return sum(v for k, v in rates.items() if k.startswith("msgs:"))
    if backend == "postgres":
        return max(rates.get("statements", rates.get("transactions", 0.0)), 0.0)
    if backend == "redis":
        return rates.get("total_commands_processed", 0.0)
    return math.nan


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]
