"""``python -m bench.shards``: sharded leadership with 1,000 names over 5 instances, aioelect beside tooz.

Each instance is its own OS process (bench/shards_members/) on one throwaway server (etcd; MariaDB and
PostgreSQL for aioelect's shared SQL sessions), reporting every name it starts or stops owning with the
system-wide monotonic clock. Measured, per implementation:

* settled balance with 5 instances (names per instance);
* a 6th instance joins, then an instance leaves gracefully (SIGTERM), then one crashes (SIGKILL): names moved
  (and the minimum the new balance needs) and the time from the event to the last move;
* steady state: CPU per instance (% of one core, over ``--steady`` seconds), server connections and (etcd)
  leases per instance;
* names owned twice at one instant (max) and for how long in all (name-seconds): the owners' own reports.

aioelect owns a name only while it holds the name's election (one shared session per instance: an EtcdSession
with lease ``--ttl``, a MySQLSession or PostgresSession with ``lease=--ttl``); tooz's Partitioner (etcd3gw
driver, membership lease ``--ttl``) is a hash ring over the group's members, each member's own view with no lock
behind it. Writes the table into bench/RESULTS.md (between the
``<!-- shards -->`` markers) and bench/out/shards.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.harness import EtcdServer, MariaDBServer, PostgresServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MEMBERS = HERE / "shards_members"
BEGIN, END = "<!-- shards -->", "<!-- /shards -->"
#: The implementations: (member script, aioelect backend or None for tooz, server).
KINDS = {
    "aioelect": ("aioelect_member.py", "etcd", "etcd"),
    "aioelect-mysql": ("aioelect_member.py", "mysql", "mariadb"),
    "aioelect-postgres": ("aioelect_member.py", "postgres", "postgres"),
    "tooz": ("tooz_member.py", None, "etcd"),
}


@dataclass
class Instance:
    identity: str
    proc: subprocess.Popen[str]
    ready: float | None = None
    owned: set[str] = field(default_factory=set)


class Fleet:
    """The instance processes of one implementation, and who owns which name according to their reports."""

    def __init__(self, kind: str, endpoint: str, names: int, ttl: int) -> None:
        self.kind = kind
        self.endpoint = endpoint
        self.names = names
        self.ttl = ttl
        self.group = f"/bench-shards/{secrets.token_hex(3)}"
        self.instances: dict[str, Instance] = {}
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.owners: dict[str, set[str]] = {str(i): set() for i in range(names)}
        self.doubled = 0
        self.max_doubled = 0
        self.double_seconds = 0.0
        self._last_t: float | None = None
        self.owns: list[float] = []  # times of every "own" report
        self.gone: set[str] = set()  # forgotten instances: their reports still in the pipe are stale

    def start(self, identity: str) -> Instance:
        script, backend, _ = KINDS[self.kind]
        argv = [
            sys.executable,
            str(MEMBERS / script),
            *([f"--backend={backend}"] if backend else []),
            f"--endpoint={self.endpoint}",
            f"--group={self.group}",
            f"--identity={identity}",
            f"--names={self.names}",
            f"--ttl={self.ttl}",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        (HERE / "out").mkdir(exist_ok=True)
        with open(HERE / "out" / f"shards-{identity}.log", "w") as errors:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
        instance = Instance(identity, proc)
        self.instances[identity] = instance

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                with contextlib.suppress(ValueError):
                    self.events.put((identity, json.loads(line)))

        threading.Thread(target=read, daemon=True).start()
        return instance

    def apply(self, identity: str, event: dict[str, Any]) -> None:
        if identity in self.gone:
            return
        t = float(event["t"])
        if self._last_t is not None and t > self._last_t:
            self.double_seconds += self.doubled * (t - self._last_t)
        self._last_t = max(t, self._last_t or t)
        instance = self.instances.get(identity)
        if event["ev"] == "ready" and instance is not None:
            instance.ready = t
        elif event["ev"] in ("own", "drop"):
            name = event["name"]
            before = len(self.owners[name]) >= 2
            if event["ev"] == "own":
                self.owners[name].add(identity)
                self.owns.append(t)
                if instance is not None:
                    instance.owned.add(name)
            else:
                self.owners[name].discard(identity)
                if instance is not None:
                    instance.owned.discard(name)
            after = len(self.owners[name]) >= 2
            self.doubled += after - before
            self.max_doubled = max(self.max_doubled, self.doubled)

    def pump(self, seconds: float) -> None:
        """Apply the reports that arrive within ``seconds``, in the order of their times: the instances' pipes
        are read by threads of their own, so one instance's ``drop`` may arrive after another's ``own``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                batch = [self.events.get(timeout=left)]
            except queue.Empty:
                return
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))  # what the other pipes sent meanwhile
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self.events.get_nowait())
            for identity, event in sorted(batch, key=lambda item: float(item[1]["t"])):
                self.apply(identity, event)

    def forget(self, identity: str) -> None:
        """A dead instance owns nothing any more (its reports stop; its names are ownerless until taken)."""
        for name in self.instances[identity].owned:
            if len(self.owners[name]) == 2 and identity in self.owners[name]:
                self.doubled -= 1
            self.owners[name].discard(identity)
        self.gone.add(identity)
        del self.instances[identity]

    def settled(self, balanced: bool) -> bool:
        live = set(self.instances)
        if any(len(o) != 1 or not o <= live for o in self.owners.values()):
            return False
        if not balanced:
            return True
        floor = self.names // len(live)
        return all(floor <= len(i.owned) <= floor + 1 for i in self.instances.values())

    def wait_settled(self, since: float, balanced: bool, timeout: float, quiet: float = 2.0) -> float | None:
        """Seconds from ``since`` to the last report that made the fleet settled (and quiet for ``quiet`` s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.2)
            if self.settled(balanced) and (not self.owns or time.monotonic() - self.owns[-1] >= quiet):
                last = max([t for t in self.owns if t >= since], default=since)
                return last - since
        return None

    def moves_since(self, since: float) -> int:
        return sum(t >= since for t in self.owns)

    def stop(self, identity: str, sig: int) -> None:
        self.instances[identity].proc.send_signal(sig)

    def close(self) -> None:
        for instance in self.instances.values():
            with contextlib.suppress(ProcessLookupError):
                instance.proc.kill()
            instance.proc.wait(10)


def usage(pids: list[int], seconds: float, fleet: Fleet) -> list[float]:
    """% of one core used by each pid over ``seconds`` (while the fleet's reports keep being read)."""
    procs = [psutil.Process(p) for p in pids]
    before = [sum(p.cpu_times()[:2]) for p in procs]
    fleet.pump(seconds)
    return [100 * (sum(p.cpu_times()[:2]) - b) / seconds for p, b in zip(procs, before, strict=True)]


def connections(pid: int, port: int) -> int:
    with contextlib.suppress(psutil.Error):
        return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp") if c.raddr and c.raddr.port == port)
    return 0


def leases(server: EtcdServer) -> int:
    import urllib.request

    req = urllib.request.Request(f"{server.client_url}/v3/lease/leases", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as reply:
        return len(json.loads(reply.read().decode()).get("leases", []))


def server_version(server: EtcdServer | MariaDBServer | PostgresServer) -> str:
    """The version the running SQL server reports (its first word)."""
    if isinstance(server, MariaDBServer):
        return str(server.query("SELECT VERSION()", database="")[0][0]).split("-")[0]
    if isinstance(server, PostgresServer):
        return str(server.query("SHOW server_version")[0][0]).split()[0]
    return server.binary_version


def say(what: str) -> None:
    print(f"bench.shards: {what}", file=sys.stderr, flush=True)


def run_one(kind: str, server: EtcdServer | MariaDBServer | PostgresServer, args: argparse.Namespace) -> dict[str, Any]:
    etcd = server if isinstance(server, EtcdServer) else None
    port = server.port if etcd is None else int(etcd.endpoint.rsplit(":", 1)[1])
    fleet = Fleet(kind, server.dsn if etcd is None else etcd.endpoint, args.names, args.ttl)
    balanced = kind != "tooz"
    result: dict[str, Any] = {"kind": kind}
    leases_before = leases(etcd) if etcd is not None else 0
    try:
        started = time.monotonic()
        for i in range(args.instances):
            fleet.start(f"{kind}-{i}")
        say(f"{kind}: {args.instances} instances started")
        took = fleet.wait_settled(started, balanced, timeout=args.timeout)
        result["cold_start_s"] = took
        result["settled"] = sorted(len(i.owned) for i in fleet.instances.values())
        pids = [i.proc.pid for i in fleet.instances.values()]
        result["cpu_pct"] = usage(pids, args.steady, fleet)
        result["connections"] = [connections(p, port) for p in pids]
        if etcd is not None:
            result["leases_per_instance"] = (leases(etcd) - leases_before) / len(pids)

        # A 6th instance joins.
        say(f"{kind} settled: {result['settled']}; a newcomer joins")
        newcomer = fleet.start(f"{kind}-{args.instances}")
        while newcomer.ready is None:
            fleet.pump(0.1)
        since = newcomer.ready
        took = fleet.wait_settled(since, balanced, timeout=args.timeout)
        result["join"] = {
            "moved": fleet.moves_since(since),
            "needed": len(newcomer.owned),
            "s": took,
            "after": sorted(len(i.owned) for i in fleet.instances.values()),
        }

        # An instance leaves gracefully (SIGTERM: its names let go, work stopped first), then one crashes.
        say(f"{kind} join: {result['join']}; one leaves")
        result["leave"] = depart(fleet, signal.SIGTERM, balanced, args)
        say(f"{kind} leave: {result['leave']}; one crashes")
        result["crash"] = depart(fleet, signal.SIGKILL, balanced, args)
    finally:
        fleet.close()
    result["max_owned_twice"] = fleet.max_doubled
    result["owned_twice_name_s"] = round(fleet.double_seconds, 2)
    return result


def depart(fleet: Fleet, sig: int, balanced: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Send ``sig`` to the oldest instance; the names that moved, the fewest needed, and the time to settle."""
    leaver = next(iter(fleet.instances))
    needed = len(fleet.instances[leaver].owned)
    proc = fleet.instances[leaver].proc
    since = time.monotonic()
    fleet.stop(leaver, sig)
    if sig == signal.SIGKILL:
        fleet.forget(leaver)  # dead at once: it owns nothing from here on
    proc.wait(args.timeout)
    if sig != signal.SIGKILL:
        fleet.pump(0.5)  # a graceful leaver's last reports
        fleet.forget(leaver)
    took = fleet.wait_settled(since, balanced, timeout=args.timeout)
    return {
        "moved": fleet.moves_since(since),
        "needed": needed,
        "s": took,
        "after": sorted(len(i.owned) for i in fleet.instances.values()),
    }


def fmt_s(value: float | None, timeout: float) -> str:
    return f"not settled within {timeout:g} s" if value is None else f"in {value:.2f} s"


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    label = {
        "aioelect": "**aioelect `Shards`**, one `EtcdSession` per instance",
        "aioelect-mysql": "**aioelect `Shards`**, one `MySQLSession` per instance (MariaDB)",
        "aioelect-postgres": "**aioelect `Shards`**, one `PostgresSession` per instance",
        "tooz": "tooz `Partitioner` (etcd3gw), `run_watchers()` every 0.2 s",
    }
    lines = [
        "| | " + " | ".join(label[r["kind"]] for r in results) + " |",
        "|---|" + "---|" * len(results),
    ]

    def row(title: str, cell: Any) -> None:
        lines.append(f"| {title} | " + " | ".join(cell(r) for r in results) + " |")

    def spread(values: list[int]) -> str:
        return f"{min(values)} to {max(values)}" if values else "-"

    def step(key: str) -> Any:
        return lambda r: (
            f"{r[key]['moved']} moved (needed {r[key]['needed']}), {fmt_s(r[key]['s'], args.timeout)}; "
            f"then {spread(r[key]['after'])}"
            if key in r
            else "not reached"
        )

    row(f"settled, {args.instances} instances: names per instance", lambda r: spread(r.get("settled", [])))
    row(f"a {args.instances + 1}th instance joins", step("join"))
    row("an instance leaves (SIGTERM)", step("leave"))
    row(f"an instance crashes (SIGKILL; etcd lease ttl, SQL `lease` {args.ttl} s)", step("crash"))
    row("names owned by two instances at one instant (max)", lambda r: str(r["max_owned_twice"]))
    row("... in all (name-seconds)", lambda r: f"{r['owned_twice_name_s']:.2f}")
    row(
        f"steady CPU per instance (% of a core, {args.steady:g} s)",
        lambda r: spread([round(c, 1) for c in r.get("cpu_pct", [])]) if "cpu_pct" in r else "-",  # type: ignore[arg-type]
    )
    row("server connections per instance", lambda r: spread(r.get("connections", [])))
    row(
        "etcd leases per instance",
        lambda r: f"{r['leases_per_instance']:.2f}" if "leases_per_instance" in r else "-",
    )
    row(
        "cold start: all instances started to settled",
        lambda r: fmt_s(r.get("cold_start_s"), args.timeout),
    )
    return lines


def write(results: list[dict[str, Any]], args: argparse.Namespace, meta: dict[str, Any]) -> None:
    """Write bench/out/shards.json (what --report-only renders again) and the section of RESULTS.md."""
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "shards.json").write_text(json.dumps({"meta": meta, "args": vars(args), "results": results}, indent=1))
    section = [
        BEGIN,
        f"## Sharded leadership: {args.names:,} names over {args.instances} instances",
        "",
        f"Generated by `python -m bench.shards` ({meta['date']}; {meta['cores']} cores shared with other work, "
        f"load average {meta['load']:.1f}; Python {meta['python']}; {meta['servers']}). One run per "
        "column: each instance its own OS process on one throwaway server. *Moved*: starts of a name's work on a new "
        "owner after the event (a name that goes from one instance to a second and then a third counts twice); "
        "*needed*: the fewest moves the new balance allows (the newcomer's share; the "
        "leaver's names). Times run from the event (the newcomer's connection ready, before it joins; the "
        "signal) to the last move; *then*: names per instance once settled.",
        "",
        *table(results, args),
        "",
        "aioelect moves a name only through its election: the old owner's work is cancelled and the name let "
        "go before the new owner's election grants it, so no name is ever owned twice (0 above, from the "
        "owners' own reports). tooz's Partitioner has no lock behind a name: each member acts on its own view "
        "of the ring, so two members believe they own a name whenever their views differ (during churn, and "
        "for as long as a member's view stays behind: *not settled* above means some names still had two "
        "believed owners when the wait ended), and a hash ring is not balanced (the spread above).",
        END,
    ]
    path = HERE / "RESULTS.md"
    text = path.read_text() if path.exists() else ""
    if BEGIN in text:
        text = text[: text.index(BEGIN)].rstrip("\n") + "\n\n" + "\n".join(section) + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(section) + "\n"
    path.write_text(text)
    print("\n".join(section))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shards", description=__doc__)
    parser.add_argument("--names", type=int, default=1000)
    parser.add_argument("--instances", type=int, default=5)
    parser.add_argument("--ttl", type=int, default=5)
    parser.add_argument("--steady", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--only", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--report-only", action="store_true", help="render bench/out/shards.json again")
    args = parser.parse_args()
    if args.report_only:
        saved = json.loads((HERE / "out" / "shards.json").read_text())
        write(saved["results"], argparse.Namespace(**saved["args"]), saved["meta"])
        return 0
    kinds = args.only.split(",")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown implementations: {sorted(unknown)}")
    needed = {KINDS[k][2] for k in kinds}
    servers: dict[str, EtcdServer | MariaDBServer | PostgresServer] = {}
    try:
        for label, factory in (("etcd", EtcdServer), ("mariadb", MariaDBServer), ("postgres", PostgresServer)):
            if label in needed:
                servers[label] = factory()
                servers[label].start()
        results = [run_one(kind, servers[KINDS[kind][2]], args) for kind in kinds]
        versions = []
        if "etcd" in servers:
            versions.append(f"etcd {servers['etcd'].binary_version}")  # type: ignore[union-attr]
        for label in ("mariadb", "postgres"):
            if label in servers:
                versions.append(f"{label} {server_version(servers[label])}")
        meta = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cores": os.cpu_count(),
            "load": os.getloadavg()[0],
            "python": platform.python_version(),
            "servers": ", ".join(versions),
        }
        write(results, args, meta)
    finally:
        for server in servers.values():
            server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
