"""The checker: judges one backend's recorded history, after the run, from data alone.

It knows nothing of processes or servers, so tests feed it constructed
histories. It reports (never raises) every violation of:

* **token order** -- a write accepted by the register with a token lower than
  one accepted before it, or a leadership whose token is not larger than that
  of a leadership that started before it;
* **overlap** -- two candidates acting (``held`` read True just before a write)
  at once for longer than the margin, not counting the time either was frozen;
* **leaderless time** -- nobody acting for longer than the bound of the faults
  in force (see :mod:`soak.timing`), or than the base bound with none;
* **leftovers** -- anything the run left behind (connections, leases, keys,
  asyncio tasks of a candidate at its clean exit, processes, a candidate that
  did not exit cleanly);
* **errors** -- a fault the nemesis could not inject or heal.

Times are ``time.monotonic_ns()`` values (system-wide on Linux).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

__all__ = [
    "NS",
    "Act",
    "Fault",
    "History",
    "Term",
    "Verdict",
    "Violation",
    "Write",
    "check",
    "claim",
    "covered",
    "leaderless",
    "overlaps",
    "stopped",
    "terms",
    "token_order",
]

#: Nanoseconds a second: times here are ``time.monotonic_ns()`` values.
NS = 1_000_000_000
#: Pauses shorter than this between acts are the candidates' own write interval, not leaderless time.
_MIN_GAP_NS = 200_000_000


@dataclass(frozen=True)
class Act:
    """One leader action: ``held`` read True at ``t0``, the fenced write returned at ``t1`` with ``ok``
    (True accepted, False rejected as stale, None failed)."""

    who: str
    token: int | None
    t0: int
    t1: int
    ok: bool | None
    #: The shard name acted on (the shards workload); "" for the one election of the other workloads.
    name: str = ""


@dataclass(frozen=True)
class Write:
    """A write the register accepted, in the register's order (``id``)."""

    id: int
    token: int
    writer: str
    sent_ns: int
    #: The register row: the backend's label, or ``label/name`` for the shards workload.
    key: str = ""


@dataclass(frozen=True)
class Fault:
    """One injected fault: in force from ``start`` to ``heal``; leaderless time it causes ends by ``deadline``."""

    kind: str
    target: str
    start: int
    heal: int
    deadline: int
    detail: str = ""
    #: The candidate it was done to ("" for the server); a ``pause`` freezes it from ``start`` to ``heal``.
    candidate: str = ""
    #: A restart: the newest token the server had granted before it went down (None: not known).
    granted_before: int | None = None


@dataclass(frozen=True)
class Term:
    """One leadership as seen by its acts: ``who`` acted under ``token`` from ``start`` to ``end``."""

    who: str
    token: int | None
    start: int
    end: int
    acts: int
    #: The shard name (the shards workload); "" for the one election of the other workloads.
    name: str = ""


@dataclass
class History:
    """Everything recorded for one backend."""

    label: str
    acts: list[Act]
    writes: list[Write]
    faults: list[Fault]
    #: The checked window (ns): leaderless time is judged between these.
    begin: int
    end: int
    #: Seconds two candidates may act at once; leaderless seconds allowed with no fault in force.
    margin: float
    base_gap: float
    leftovers: list[str] = field(default_factory=list)
    #: Faults the nemesis could not inject or heal: the run did not test what it claims.
    errors: list[str] = field(default_factory=list)
    #: The shards workload's names (each its own election and register row); empty for one election.
    names: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Violation:
    kind: str  # "token", "overlap", "gap", "leftover", "error"
    message: str
    at: int | None = None


@dataclass
class Verdict:
    """The checker's findings and the figures of the summary."""

    label: str
    violations: list[Violation]
    terms: list[Term]
    faults_by_kind: dict[str, int]
    accepted: int
    rejected: int
    failed: int
    max_gap: float
    max_gap_bound: float
    max_overlap: float
    margin: float

    @property
    def ok(self) -> bool:
        return not self.violations


def terms(acts: list[Act]) -> list[Term]:
    """Each candidate's acts grouped into leaderships (a new token starts a new one), ordered by start."""
    found: list[Term] = []
    by_who: dict[str, list[Act]] = {}
    for act in acts:
        by_who.setdefault(act.who, []).append(act)
    for who, own in by_who.items():
        own.sort(key=lambda a: a.t0)
        first = own[0]
        last = own[0]
        count = 0
        for act in own:
            if act.token != first.token:
                found.append(Term(who, first.token, first.t0, last.t0, count))
                first, count = act, 0
            last = act
            count += 1
        found.append(Term(who, first.token, first.t0, last.t0, count))
    found.sort(key=lambda t: (t.start, t.who))
    return found


def _token_violations(history: History, leaderships: list[Term]) -> list[Violation]:
    found: list[Violation] = []
    highest: Write | None = None
    for write in sorted(history.writes, key=lambda w: w.id):
        if highest is not None and write.token < highest.token:
            found.append(
                Violation(
                    "token",
                    f"write {write.id} by {write.writer} accepted with token {write.token} "
                    f"after write {highest.id} by {highest.writer} with token {highest.token}",
                    write.sent_ns,
                )
            )
        if highest is None or write.token >= highest.token:
            highest = write
    found += [
        Violation("token", f"{t.who} led without a fencing token", t.start) for t in leaderships if t.token is None
    ]
    return found + token_order(leaderships)


def token_order(leaderships: list[Term]) -> list[Violation]:
    """Leaderships (ordered by start) whose token is not larger than that of the last one before them with a
    token; a leadership without a token is passed over."""
    found: list[Violation] = []
    previous: Term | None = None
    for term in leaderships:
        if term.token is None:
            continue
        if previous is not None and previous.token is not None and term.token <= previous.token:
            found.append(
                Violation(
                    "token",
                    f"{term.who}'s leadership (token {term.token}) started after {previous.who}'s "
                    f"(token {previous.token}) but its token is not larger",
                    term.start,
                )
            )
        previous = term
    return found


def covered(intervals: list[tuple[int, int]], a: int, b: int) -> int:
    """How much of ``a``..``b`` the (possibly overlapping) ``intervals`` cover."""
    total, cursor = 0, a
    for start, end in sorted(intervals):
        start, end = max(start, cursor), min(end, b)
        if end > start:
            total += end - start
            cursor = end
    return total


def stopped(faults: list[Fault], kind: str) -> dict[str, list[tuple[int, int]]]:
    """Each candidate's stretches (``start``, ``heal``) under the faults of ``kind`` done to it."""
    found: dict[str, list[tuple[int, int]]] = {}
    for fault in faults:
        if fault.kind == kind and fault.candidate:
            found.setdefault(fault.candidate, []).append((fault.start, fault.heal))
    return found


def overlaps(
    leaderships: list[Term], faults: list[Fault], margin_ns: int, *, strict: bool = False
) -> tuple[list[Violation], int]:
    """Pairs of candidates that both acted for longer than ``margin_ns``, and the longest such time (ns).

    The time both acted is their leaderships' common stretch, less the time either was frozen by a ``pause``
    fault (a SIGSTOPped process does not act; a leader deposed while frozen acts on waking until it notices).

    ``strict`` (the fault suites, which excuse no fault): a leadership that begins and ends inside another
    candidate's counts as long as the other went on after it began, and a single act inside one counts: the
    other never noticed a grant it should have lost its lock to.
    """
    frozen = stopped(faults, "pause")
    found: list[Violation] = []
    worst = 0
    for i, later in enumerate(leaderships):
        for earlier in leaderships[:i]:
            if earlier.who == later.who:
                continue
            # Of two terms that start together, either may be the one inside the other.
            inner, outer = (later, earlier) if later.end <= earlier.end else (earlier, later)
            inside = strict and outer.start <= inner.start and inner.end <= outer.end and inner.start < outer.end
            a, b = (inner.start, outer.end) if inside else (later.start, min(earlier.end, later.end))
            if b <= a:
                continue
            overlap = b - a - covered(frozen.get(earlier.who, []) + frozen.get(later.who, []), a, b)
            worst = max(worst, overlap)
            if overlap > margin_ns:
                found.append(
                    Violation(
                        "overlap",
                        f"{earlier.who} (token {earlier.token}) and {later.who} (token {later.token}) "
                        f"both acted for {overlap / NS:.3f} s (margin {margin_ns / NS:.2f} s)"
                        + (f": {inner.who} led inside {outer.who}'s term" if inside else ""),
                        later.start,
                    )
                )
    return found, worst


def claim(
    faults: list[Fault],
    used: set[int],
    at: int,
    window_ns: int,
    kinds: tuple[str, ...],
    fits: Callable[[Fault], bool] = lambda fault: True,
) -> bool:
    """Whether an operator action of ``kinds`` done at most ``window_ns`` before ``at`` (and that ``fits``)
    explains a loss at ``at``; the first such action not in ``used`` is added to it, so that one action
    explains one loss at most. An action that found nothing to act on (detail "no ...") explains nothing."""
    for i, fault in enumerate(faults):
        if fault.kind not in kinds or fault.detail.startswith("no ") or i in used:
            continue
        if fault.start <= at <= fault.start + window_ns and fits(fault):
            used.add(i)
            return True
    return False


def leaderless(
    leaderships: list[Term], faults: list[Fault], begin: int, end: int, base_gap: float
) -> tuple[list[Violation], float, float]:
    """Stretches of ``begin``..``end`` in which nobody acted for longer than ``base_gap`` s or, with faults in
    force, than the latest of their deadlines; and the worst stretch against its bound (s, s)."""
    spans = sorted((t.start, t.end) for t in leaderships if t.end >= begin and t.start <= end)
    stretches: list[tuple[int, int]] = []
    cursor = begin
    for start, stop in spans:
        if start > cursor:
            stretches.append((cursor, start))
        cursor = max(cursor, stop)
    if end > cursor:
        stretches.append((cursor, end))
    found: list[Violation] = []
    worst, worst_bound, worst_ratio = 0.0, base_gap, -1.0
    for a, b in stretches:
        if b - a < _MIN_GAP_NS:
            continue
        deadline = a + int(base_gap * NS)
        in_force = [f for f in faults if f.start <= b and f.deadline >= a]
        for fault in in_force:
            deadline = max(deadline, fault.deadline)
        gap, bound = (b - a) / NS, (deadline - a) / NS
        if gap / bound > worst_ratio:
            worst, worst_bound, worst_ratio = gap, bound, gap / bound
        if b > deadline:
            names = ", ".join(f"{f.kind} {f.target}" for f in in_force) or "none"
            found.append(
                Violation("gap", f"nobody led for {gap:.2f} s (bound {bound:.2f} s; faults in force: {names})", a)
            )
    return found, worst, worst_bound


def _name_key(history: History, name: str) -> str:
    return f"{history.label}/{name}"


def _shards(history: History) -> tuple[list[Violation], list[Term], int, float, float]:
    """Each name judged as an election of its own: token order and overlap per name; and every name owned
    (acted on) within ``base_gap`` of the end of the window, when no fault is in force any more.

    Leaderless time per name is not bounded during faults: a name also moves when an instance joins or
    leaves, and how long a move takes is the rebalance's, not a fault's.
    """
    violations: list[Violation] = []
    leaderships: list[Term] = []
    worst_overlap = 0
    max_idle, idle_bound = 0.0, history.base_gap
    for name in history.names:
        acts = [a for a in history.acts if a.name == name]
        own = History(
            label=f"{history.label}/{name}",
            acts=acts,
            writes=[w for w in history.writes if w.key == _name_key(history, name)],
            faults=history.faults,
            begin=history.begin,
            end=history.end,
            margin=history.margin,
            base_gap=history.base_gap,
        )
        mine = [replace(t, name=name) for t in terms(acts)] if acts else []
        leaderships += mine
        found = _token_violations(own, mine)
        found_overlaps, worst = overlaps(mine, history.faults, int(history.margin * NS))
        worst_overlap = max(worst_overlap, worst)
        found += found_overlaps
        if not mine:
            found.append(Violation("gap", "nobody ever led"))
        else:
            idle = (history.end - max(t.end for t in mine)) / NS
            max_idle = max(max_idle, idle)
            if idle > history.base_gap:
                found.append(
                    Violation(
                        "gap",
                        f"nobody acted for the last {idle:.2f} s of the run (bound {history.base_gap:.2f} s, "
                        "no fault in force)",
                        history.end,
                    )
                )
        violations += [Violation(v.kind, f"{name}: {v.message}", v.at) for v in found]
    leaderships.sort(key=lambda t: (t.start, t.who))
    return violations, leaderships, worst_overlap, max_idle, idle_bound


def check(history: History) -> Verdict:
    """Judge ``history``; the verdict lists every violation and the summary figures.

    With :attr:`History.names` (the shards workload), every name is judged as an election of its own
    (:func:`_shards`); the figures are the worst over the names.
    """
    if history.names:
        violations, leaderships, worst_overlap, max_gap, max_gap_bound = _shards(history)
    else:
        leaderships = terms(history.acts)
        violations = _token_violations(history, leaderships)
        found_overlaps, worst_overlap = overlaps(leaderships, history.faults, int(history.margin * NS))
        violations += found_overlaps
        gaps, max_gap, max_gap_bound = leaderless(
            leaderships, history.faults, history.begin, history.end, history.base_gap
        )
        violations += gaps
    violations += [Violation("leftover", item) for item in history.leftovers]
    violations += [Violation("error", item) for item in history.errors]
    if not leaderships:
        violations.append(Violation("gap", "nobody ever led"))
    outcomes = Counter(a.ok for a in history.acts)
    return Verdict(
        label=history.label,
        violations=violations,
        terms=leaderships,
        faults_by_kind=dict(Counter(f.kind for f in history.faults)),
        accepted=outcomes[True],
        rejected=outcomes[False],
        failed=outcomes[None],
        max_gap=max_gap,
        max_gap_bound=max_gap_bound,
        max_overlap=worst_overlap / NS,
        margin=history.margin,
    )
