"""Sharded leadership under the adversary: several :class:`aioelect.Shards` instances own a set of names.

Each instance runs in this process with its own :class:`_Link` (a
:class:`~.network.Network` that can also be cut): every elector it builds,
for its member elections and for each name, talks to the server through
that link. While an instance owns a name its work records an act every
20-50 ms (a read of ``held`` that was True, with the name's token).

Beside the message faults and the operator's actions on the server:

* instances leave (their run cancelled: every name resigned) and join
  again; one leave in three is a crash (every exchange dropped as it goes,
  so the server hears no resign);
* an instance's link is partitioned: every exchange fails at once (drop) or
  hangs until the partition heals (stall), for 0.5 to 4 s.

Each name is judged on its own by :func:`soak.checker.check` and
:func:`~.run.tokens`: no two instances acting on one name at once beyond
the margin, and each name's tokens growing. A process pause is not
played: the instances share one event loop.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

import aioelect
from soak.checker import Act, Fault, History, Term, Verdict, Violation, check

from .network import Network, Profile
from .run import OPTIONS, Outcome, _attach, _listen, _operator, _Trace, margin, tokens
from .servers import Target

__all__ = ["run_shards"]

_NS = 1_000_000_000

#: The names the instances share.
NAMES = 8


class _Link(Network):
    """An instance's link to the server: the adversary's faults, and a partition that drops or stalls it all."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cut: str | None = None
        self.healed = anyio.Event()

    async def exchange(self, what: str, send: Callable[[], Awaitable[Any]]) -> Any:
        if self.active and self.cut == "drop":
            self.counts["partitioned exchange"] += 1
            raise self._lost(what)
        if self.active and self.cut == "stall":
            self.counts["partitioned exchange"] += 1
            await self.healed.wait()
        return await super().exchange(what, send)


class _Instance:
    """One Shards instance that joins, leaves and joins again; its acts per name."""

    def __init__(self, who: str, target: Target, link: _Link, rng: random.Random, trace: _Trace) -> None:
        self.who = who
        self.target = target
        self.link = link
        self.rng = rng
        self.trace = trace
        self.acts: dict[str, list[Act]] = {}
        self.counts: dict[str, int] = {}

    def _elector(self, election: str) -> aioelect.Elector:
        backend = self.target.backend
        options = {**OPTIONS[backend], **self.target.extra_options}
        elector = aioelect.new(**{backend: self.target.target()}, name=election, identity=self.who, **options)
        _attach(elector, self.link)
        if "/shard/" in election:
            _listen(elector, self.trace.sink(f"{self.who}:{election.rpartition('/')[2]}"))
        self.target.electors.append(elector)
        return elector

    async def _work(self, name: str) -> None:
        lead = aioelect.current_leadership()
        assert lead is not None
        self.counts["leadership"] = self.counts.get("leadership", 0) + 1
        acts = self.acts.setdefault(name, [])
        while True:
            t0 = time.monotonic_ns()
            if not lead.held:
                await anyio.sleep_forever()  # the name's leadership ends: Shards cancels this
            acts.append(Act(self.who, lead.token, t0, time.monotonic_ns(), True))
            await anyio.sleep(self.rng.uniform(0.02, 0.05))

    async def _leave(self, tg: anyio.abc.TaskGroup, stay: float, crash: bool) -> None:
        """After ``stay`` s, end the instance's run (``crash``: with every exchange dropped meanwhile)."""
        await anyio.sleep(stay)
        what = "crash" if crash else "leave"
        self.trace.sink(self.who)("crashes" if crash else "leaves")
        self.counts[what] = self.counts.get(what, 0) + 1
        if crash:
            self.link.cut = "drop"
        tg.cancel_scope.cancel()

    async def loop(self, until: float, group: str, names: list[str], slots: int) -> None:
        """Join for 4-12 s, leave for 0.5-3 s, and again, until ``until``; the first join within a second.

        One leave in three is a crash: every exchange is dropped while the
        instance goes, so no release or revoke reaches the server (etcd's
        lease expires; a SQL server sees the connection close).
        """
        rng, say = self.rng, self.trace.sink(self.who)
        await anyio.sleep(rng.uniform(0.0, 1.0))
        while time.monotonic() < until:
            shards = aioelect.Shards(names, group=group, identity=self.who, electors=self._elector, max_instances=slots)
            crash = rng.random() < 1 / 3
            # Long enough to own names: joining takes a few seconds under the adversary (every member election seen).
            stay = min(rng.uniform(4.0, 12.0), until - time.monotonic())
            say("joins")
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._leave, tg, stay, crash and stay < until - time.monotonic())
                await shards.run(self._work)
            if self.link.cut == "drop" and crash:
                self.link.cut = None
            if time.monotonic() < until:
                await anyio.sleep(rng.uniform(0.5, 3.0))


async def _partitions(
    instances: list[_Instance], rng: random.Random, until: float, faults: list[Fault], say: Any
) -> None:
    """Cut one instance's link every 1-5 s, for 0.5-4 s: every exchange dropped, or stalled until it heals."""
    while True:
        await anyio.sleep(rng.uniform(1.0, 5.0))
        if time.monotonic() >= until:
            return
        instance = rng.choice(instances)
        link, kind = instance.link, rng.choice(["drop", "stall"])
        start = time.monotonic_ns()
        link.cut, link.healed = kind, anyio.Event()
        say(f"partition-{kind} of {instance.who}")
        await anyio.sleep(rng.uniform(0.5, 4.0))
        link.cut = None
        link.healed.set()
        heal = time.monotonic_ns()
        say(f"partition of {instance.who} healed")
        faults.append(Fault(f"partition-{kind}", instance.who, start, heal, heal, "", instance.who))


class _OnElections:
    """The target, each operator action aimed at one of the group's elections (the SQL actions name one lock)."""

    def __init__(self, target: Target, elections: list[str], rng: random.Random) -> None:
        self._target = target
        self._elections = elections
        self._rng = rng

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    async def act(self, action: str, rng: random.Random) -> str:
        target = self._target
        group = target.name
        if target.backend == "etcd":  # etcd's actions take any key under the group
            return await target.act(action, rng)
        target.name = election = self._rng.choice(self._elections)
        try:
            detail = await target.act(action, rng)
        finally:
            target.name = group
        return f"{detail} ({election})"


def judge(
    acts: dict[str, list[Act]], faults: list[Fault], begin: int, end: int, bound: float, errors: list[str], label: str
) -> tuple[list[Violation], list[Term]]:
    """Each name on its own: two owners acting at once beyond ``bound`` s, a token that does not grow."""
    violations: list[Violation] = []
    terms: list[Term] = []
    for name, own in acts.items():
        history = History(f"{label} name {name}", own, [], faults, begin, end, bound, base_gap=(end - begin) / _NS)
        verdict = check(history)
        found = [v for v in verdict.violations if v.kind not in ("token", "gap")] + tokens(verdict.terms, bound)
        violations += [dataclasses.replace(v, message=f"name {name}: {v.message}") for v in found]
        terms += verdict.terms
    violations += [Violation("error", error) for error in errors]
    return violations, terms


async def run_shards(
    target: Target, seed: int, seconds: float, *, instances: int | None = None, profile: Profile | None = None
) -> Outcome:
    """Run Shards instances over :data:`NAMES` names against ``target`` for ``seconds``; judge every name."""
    master = random.Random(seed)
    profile = profile or Profile.draw(master, target.kinds)
    count = instances or master.randint(3, 5)
    group = target.name
    names = [f"n{i}" for i in range(NAMES)]
    trace = _Trace()
    target.electors = []
    members: list[_Instance] = []
    for i in range(count):
        who = f"s{i}"
        link = _Link(random.Random(master.getrandbits(64)), profile, target.lost, target.cancelled, trace.sink(who))
        members.append(_Instance(who, target, link, random.Random(master.getrandbits(64)), trace))
    operator_rng = random.Random(master.getrandbits(64))
    partition_rng = random.Random(master.getrandbits(64))
    probe = aioelect.Shards(names, group=group, electors=lambda n: None)  # type: ignore[arg-type,return-value]
    elections = [probe.shard_election(n) for n in names] + [probe.member_election(k) for k in range(count + 1)]
    faults: list[Fault] = []
    errors: list[str] = []
    begin = time.monotonic_ns()
    until = time.monotonic() + seconds
    try:
        async with anyio.create_task_group() as tg:
            for member in members:
                tg.start_soon(member.loop, until, group, names, count + 1)
            operator = _OnElections(target, elections, operator_rng)
            tg.start_soon(_operator, operator, [], operator_rng, until, faults, errors, trace.sink("operator"))
            tg.start_soon(_partitions, members, partition_rng, until, faults, trace.sink("network"))
    finally:
        for member in members:
            member.link.active = False
    end = time.monotonic_ns()
    bound = margin(target.backend, profile)
    acts = {name: [act for m in members for act in m.acts.get(name, [])] for name in names}
    violations, terms = judge(acts, faults, begin, end, bound, errors, f"{target.backend} shards seed {seed}")
    counts: dict[str, int] = {}
    for m in members:
        for key, value in list(m.link.counts.items()) + list(m.counts.items()):
            counts[key] = counts.get(key, 0) + value
    for fault in faults:
        counts[fault.kind] = counts.get(fault.kind, 0) + 1
    verdict = Verdict(
        label=f"{target.backend} shards seed {seed}",
        violations=violations,
        terms=terms,
        faults_by_kind={},
        accepted=0,
        rejected=0,
        failed=0,
        max_gap=0.0,
        max_gap_bound=0.0,
        max_overlap=0.0,
        margin=bound,
    )
    return Outcome(f"{target.label} shards", seed, verdict, faults, [], counts, trace.lines, profile.slow)
