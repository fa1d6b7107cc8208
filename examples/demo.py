"""The scheduler demo: three instances, one leader, a crash, a takeover.

``make demo`` runs ``python examples/demo.py``; ``make demo BACKEND=mysql``
adds ``--backend mysql``. It

1. starts a backend: with no ``--backend``, a lock file in a temporary
   directory (nothing to install); ``mysql``, ``etcd`` and ``postgres`` start
   a throwaway server with the repository's test harness (``tests/harness/``) unless
   ``AIOELECT_MYSQL_DSN`` / ``AIOELECT_ETCD_ENDPOINTS`` /
   ``AIOELECT_POSTGRES_DSN`` points at one; ``local`` shows what happens
   without mutual exclusion;
2. starts three ``examples/scheduler.py`` processes and prints their events
   as one timeline (times relative to the start);
3. kills the leader with SIGKILL part-way, waits for another instance to take
   over, lets it run, then stops every instance;
4. prints a summary: who led when, how long the takeover took, how many jobs
   fired, and whether any job fired twice.

Exit status: 0 when a takeover happened, leaderships did not overlap and no
job fired twice (for ``local``: when the duplicates it must produce were
seen); 1 otherwise; 2 when the backend cannot be set up. The whole run is
bounded by ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib.util
import itertools
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEDULER = os.path.join(HERE, "scheduler.py")
BACKENDS = ("file", "mysql", "etcd", "postgres", "redis", "local")
ENV_VARS = {
    "mysql": "AIOELECT_MYSQL_DSN",
    "etcd": "AIOELECT_ETCD_ENDPOINTS",
    "postgres": "AIOELECT_POSTGRES_DSN",
    "redis": "AIOELECT_REDIS_URL",
    "file": "AIOELECT_FILE",
}


class SetupError(Exception):
    """The backend could not be set up (exit status 2)."""


@dataclass
class Backend:
    kind: str
    #: The environment the schedulers get (their only configuration: aioelect.from_env()).
    env: dict[str, str]
    #: --elector-option values for the schedulers.
    options: list[str]
    where: str
    #: How long a takeover after a SIGKILL may take before the demo fails.
    takeover_bound: float = 15.0
    exclusive: bool = True


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def default_backend() -> str:
    """The file backend needs nothing installed; before it existed, a throwaway MariaDB."""
    return "file" if module_available("aioelect.backends.file") else "mysql"


def _clean_env() -> dict[str, str]:
    # Only the backend chosen here may reach the schedulers: from_env() prefers etcd over MySQL...
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOELECT_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def setup_backend(kind: str, stack: contextlib.ExitStack, workdir: str) -> Backend:
    """Configure ``kind``, starting a throwaway server (cleaned up by ``stack``) if none is given."""
    env = _clean_env()
    suffix = secrets.token_hex(3)
    env["AIOELECT_NAME"] = f"/aioelect-demo/{suffix}" if kind == "etcd" else f"aioelect-demo-{suffix}"
    if kind == "local":
        env["AIOELECT_BACKEND"] = "local"  # never chosen by from_env() unless asked for
        return Backend("local", env, [], "in each process (no coordination at all)", exclusive=False)
    if kind == "file":
        if not module_available("aioelect.backends.file"):
            raise SetupError("the file backend (aioelect.backends.file) is not available in this version")
        path = os.path.join(workdir, "leader.lock")
        env["AIOELECT_FILE"] = path
        return Backend("file", env, [], f"lock file {path}", takeover_bound=10.0)

    # The throwaway servers come from the repository's test harness (tests/harness/), which the package does not ship.
    sys.path.insert(0, os.path.dirname(HERE))
    from tests import harness as testing

    given = os.environ.get(ENV_VARS[kind], "").strip()
    server: Any = None
    if not given:
        factory: Callable[[], Any] = {
            "mysql": testing.MariaDBServer,
            "etcd": testing.EtcdServer,
            "postgres": testing.PostgresServer,
            "redis": testing.RedisServer,
        }[kind]
        try:
            server = factory()
        except testing.MissingBinaryError as exc:
            raise SetupError(f"{exc}\n  install the servers with `make servers`, or set {ENV_VARS[kind]}") from None
        stack.callback(server.cleanup)
        say(f"starting a throwaway {server.kind} server for the demo...")
        started = time.monotonic()
        try:
            server.start()
        except testing.HarnessError as exc:
            raise SetupError(str(exc)) from None
        say(f"  ready on 127.0.0.1:{server.port} after {time.monotonic() - started:.1f}s")
    if kind == "etcd":
        endpoints = given or server.endpoint
        env["AIOELECT_ETCD_ENDPOINTS"] = endpoints
        # A short lease so the takeover after a SIGKILL is quick; never fall back to "always leader".
        return Backend("etcd", env, ["ttl=3", "degrade_to_local=false"], f"etcd at {endpoints}", takeover_bound=20.0)
    if kind == "redis":
        url = given or server.url
        env["AIOELECT_REDIS_URL"] = url
        parts = urlsplit(url)
        # A short lease so the takeover after a SIGKILL is quick.
        options = ["lease=3", "check_interval=0.3", "poll_interval=0.5"]
        return Backend("redis", env, options, f"redis at {parts.hostname}:{parts.port}", takeover_bound=10.0)
    dsn = given or server.dsn
    env[ENV_VARS[kind]] = dsn
    parts = urlsplit(dsn)
    options = ["poll_interval=0.5"]
    if parts.path.strip("/"):
        options.append("fencing=true")  # tokens, and identities for leader()/observe()
    where = f"{parts.hostname}:{parts.port}{parts.path}"  # never the password
    return Backend(kind, env, options, f"{kind} at {where}")


# --- output -----------------------------------------------------------------------------


def settings_line(backend: Backend) -> str:
    """The one line that says which backend and which elector options every instance runs with."""
    given = " ".join(backend.options) if backend.options else "none"
    return f"settings: backend {backend.kind}, options {given}; every other option at its default"


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def describe(event: dict[str, Any]) -> str:
    kind = event["event"]
    token = f"token {event['token']}" if event.get("token") is not None else ""
    if kind == "start":
        return f"pid {event.get('pid')}, backend {event.get('backend')}"
    if kind == "follow":
        return f"waiting; the leader is {event.get('leader')}"
    if kind in ("fire", "retry"):
        text = f"{event.get('id'):<26} {token}"
        return text + ("   (failed: retry in 1s)" if event.get("ok") is False else "")
    if kind in ("lost", "released"):
        return token + (f"  ({event['reason']})" if event.get("reason") else "")
    if kind == "stopping":
        return "SIGTERM to every instance, followers first"
    if kind == "leader":
        return token + (f"   (takeover {event['takeover']:.3f}s after the kill)" if "takeover" in event else "")
    if kind == "kill":
        return f"{event['victim']} (SIGKILL, pid {event['pid']})"
    return " ".join(str(v) for k, v in event.items() if k not in ("t", "instance", "event") and v is not None)


# --- the run -------------------------------------------------------------------------------


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_prctl = _load_prctl()


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    if _prctl is not None:
        _prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


@dataclass
class Instance:
    name: str
    proc: asyncio.subprocess.Process
    log_path: str
    reader: asyncio.Task[None] | None = None
    killed: bool = False


@dataclass
class Demo:
    backend: Backend
    workdir: str
    instances_wanted: int = 3
    kill_after: float = 7.0
    run_after: float = 6.0
    start: float = field(default_factory=time.time)
    events: list[dict[str, Any]] = field(default_factory=list)
    instances: list[Instance] = field(default_factory=list)
    kill_time: float | None = None

    def record(self, event: dict[str, Any]) -> None:
        if event["event"] == "leader" and self.kill_time is not None and event["t"] >= self.kill_time:
            event["takeover"] = event["t"] - self.kill_time
        self.events.append(event)
        say(
            f"  t+{event['t'] - self.start:7.3f}s  {event['instance']:<12}  {event['event'].upper():<9} "
            f"{describe(event)}".rstrip()
        )

    async def _read(self, inst: Instance) -> None:
        assert inst.proc.stdout is not None
        async for raw in inst.proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                say(f"  {inst.name}: {raw.decode(errors='replace').rstrip()}")
                continue
            self.record(event)

    async def spawn(self, name: str) -> Instance:
        log_path = os.path.join(self.workdir, f"{name}.log")
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, SCHEDULER, "--instance", name, "--json",
                *[arg for option in self.backend.options for arg in ("--elector-option", option)],
                stdout=asyncio.subprocess.PIPE, stderr=log_fd, env=self.backend.env, preexec_fn=_die_with_parent,
            )  # fmt: skip
        finally:
            os.close(log_fd)
        inst = Instance(name, proc, log_path)
        inst.reader = asyncio.ensure_future(self._read(inst))
        self.instances.append(inst)
        return inst

    def leaders_now(self) -> list[str]:
        """Instances whose last leadership event says they lead, and that were not killed."""
        state: dict[str, bool] = {}
        for event in self.events:
            if event["event"] == "leader":
                state[event["instance"]] = True
            elif event["event"] in ("lost", "released", "stop"):
                state[event["instance"]] = False
        killed = {i.name for i in self.instances if i.killed}
        return [name for name, leading in state.items() if leading and name not in killed]

    async def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:g}s")
            for inst in self.instances:
                if inst.proc.returncode not in (None, 0) and not inst.killed:
                    raise RuntimeError(f"{inst.name} exited with status {inst.proc.returncode}")
            await asyncio.sleep(0.02)

    async def run(self) -> None:
        for n in range(1, self.instances_wanted + 1):
            await self.spawn(f"scheduler-{n}")
            await asyncio.sleep(0.3)  # staggered, so the timeline reads in order
        await self.wait_for("an instance to become leader", lambda: bool(self.leaders_now()), 30.0)
        await asyncio.sleep(self.kill_after)
        leaders = self.leaders_now()
        victim = next(i for i in self.instances if i.name == leaders[0])
        victim.killed = True
        self.kill_time = time.time()
        victim.proc.kill()
        self.record({"t": self.kill_time, "instance": "demo", "event": "kill", "victim": victim.name,
                     "pid": victim.proc.pid})  # fmt: skip
        if self.backend.exclusive:
            await self.wait_for(
                "another instance to take over",
                lambda: any(e["event"] == "leader" and "takeover" in e for e in self.events),
                self.backend.takeover_bound,
            )
        await asyncio.sleep(self.run_after)

    async def stop(self) -> None:
        """Followers first, then leaders, so nobody takes over during the shutdown."""
        leaders = set(self.leaders_now())
        running = [i for i in self.instances if i.proc.returncode is None]
        if running:
            self.record({"t": time.time(), "instance": "demo", "event": "stopping"})
        for group in ([i for i in running if i.name not in leaders], [i for i in running if i.name in leaders]):
            for inst in group:
                with contextlib.suppress(ProcessLookupError):
                    inst.proc.send_signal(signal.SIGTERM)
            for inst in group:
                try:
                    await asyncio.wait_for(inst.proc.wait(), 10.0)
                except asyncio.TimeoutError:
                    say(f"  {inst.name} did not stop within 10s: SIGKILL")
                    inst.proc.kill()
                    await inst.proc.wait()
        for inst in self.instances:
            if inst.proc.returncode is None:
                inst.proc.kill()
                await inst.proc.wait()
            if inst.reader is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(inst.reader, 5.0)

    def log_tails(self) -> str:
        parts = []
        for inst in self.instances:
            with open(inst.log_path, errors="replace") as fh:
                tail = fh.read()[-1500:].strip()
            if tail:
                parts.append(f"--- {inst.name} stderr (last lines) ---\n{tail}")
        return "\n".join(parts)


# --- the summary ---------------------------------------------------------------------------


def analyse(demo: Demo, finished: bool) -> dict[str, Any]:
    """Leaderships, takeover, fires, duplicates and overlaps, from the recorded events."""
    leaderships: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    victims = {e["victim"]: e["t"] for e in demo.events if e["event"] == "kill"}
    for e in demo.events:
        who = e["instance"]
        if e["event"] == "leader":
            entry = {"instance": who, "token": e.get("token"), "start": e["t"], "end": None, "ended": "running",
                     "fires": 0}  # fmt: skip
            leaderships.append(entry)
            open_[who] = entry
        elif e["event"] in ("fire", "retry") and who in open_:
            open_[who]["fires"] += 1
        elif e["event"] in ("lost", "released") and who in open_:
            entry = open_.pop(who)
            entry["end"], entry["ended"] = e["t"], e["event"]
        elif e["event"] == "kill" and e["victim"] in open_:
            entry = open_.pop(e["victim"])
            entry["end"], entry["ended"] = e["t"], "killed"
    fires = [e for e in demo.events if e["event"] in ("fire", "retry")]
    counts = Counter(e["id"] for e in fires)
    duplicates = sorted(fire_id for fire_id, n in counts.items() if n > 1)
    overlaps = []
    ordered = sorted(leaderships, key=lambda entry: entry["start"])
    for before, after in itertools.pairwise(ordered):
        if before["end"] is None or after["start"] < before["end"]:
            overlaps.append(f"{after['instance']} led from t+{after['start'] - demo.start:.3f}s "
                            f"while {before['instance']} still led")  # fmt: skip
    takeover = next((e for e in demo.events if e["event"] == "leader" and "takeover" in e), None)
    victim = next(iter(victims), None)
    if demo.backend.exclusive:
        ok = finished and takeover is not None and not duplicates and not overlaps and bool(fires)
    else:
        ok = finished and bool(duplicates)  # the negative control: without exclusion, jobs must repeat
    spans = [
        {**entry, "start": e["start"] - demo.start, "end": None if e["end"] is None else e["end"] - demo.start}
        for entry in leaderships
        for e in (entry,)
    ]
    return {
        "backend": demo.backend.kind,
        "ok": ok,
        "finished": finished,
        "exclusive": demo.backend.exclusive,
        "leaderships": spans,
        "killed": victim,
        "new_leader": takeover["instance"] if takeover else None,
        "takeover_seconds": takeover["takeover"] if takeover else None,
        "fires": len(fires),
        "distinct_fires": len(counts),
        "retries": sum(1 for e in fires if e["event"] == "retry"),
        "duplicates": duplicates,
        "overlaps": overlaps,
        "events": [{**e, "t": e["t"] - demo.start} for e in demo.events],
    }


def print_summary(summary: dict[str, Any]) -> None:
    say("")
    say("Summary")
    say("  who led when:")
    for entry in summary["leaderships"]:
        end = "end of the demo" if entry["end"] is None else f"t+{entry['end']:.3f}s"
        say(f"    {entry['instance']:<12}  token {entry['token']!s:<5} t+{entry['start']:.3f}s -> {end:<16}"
            f"{entry['ended']:<9} fired {entry['fires']} jobs")  # fmt: skip
    if summary["takeover_seconds"] is not None:
        say(f"  takeover: {summary['new_leader']} led {summary['takeover_seconds']:.3f}s after "
            f"{summary['killed']} was killed")  # fmt: skip
    elif summary["killed"] is None:
        say("  takeover: none (the demo ended before the leader was killed)")
    elif summary["exclusive"]:
        say(f"  takeover: NONE after {summary['killed']} was killed")
    say(f"  jobs fired: {summary['fires']} ({summary['retries']} of them retries), "
        f"{summary['distinct_fires']} distinct ids")  # fmt: skip
    if summary["duplicates"]:
        say(f"  fired more than once: {len(summary['duplicates'])} job ids, e.g. {summary['duplicates'][0]}")
    else:
        say("  no job fired twice")
    for overlap in summary["overlaps"]:
        say(f"  OVERLAP: {overlap}")
    if not summary["exclusive"]:
        say("  the local backend gives no mutual exclusion between processes: every instance leads and")
        say("  every job fires once per instance. That is expected: use file, mysql, postgres or etcd.")
    say(f"  result: {'OK' if summary['ok'] else 'FAILED'}")


# --- entry point ---------------------------------------------------------------------------


async def _main(demo: Demo, timeout: float) -> str:
    """Run the demo; return "finished", "failed" or "interrupted"."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    outcome = "failed"
    try:
        await asyncio.wait_for(demo.run(), timeout)
        outcome = "finished"
    except (TimeoutError, asyncio.TimeoutError, RuntimeError) as exc:
        say(f"\n  the demo failed: {exc or f'it took more than {timeout:g}s'}")
    except asyncio.CancelledError:
        say("\n  interrupted: stopping every instance")
        outcome = "interrupted"
    finally:
        await asyncio.shield(demo.stop())
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, help="default: file (a throwaway MariaDB if no file backend)")
    parser.add_argument("--instances", type=int, default=3, help="scheduler processes (default 3)")
    parser.add_argument("--kill-after", type=float, default=7.0, help="seconds of leading before the kill (7)")
    parser.add_argument("--run-after", type=float, default=6.0, help="seconds to run after the takeover (6)")
    parser.add_argument("--timeout", type=float, default=90.0, help="bound on the whole run, in seconds (90)")
    parser.add_argument("--summary-json", metavar="PATH", help="also write the summary (and events) as JSON")
    args = parser.parse_args(argv)
    if args.instances < 2:
        parser.error("--instances must be at least 2: one to kill, one to take over")
    kind = args.backend or default_backend()
    with contextlib.ExitStack() as stack:
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="aioelect-demo-"))
        try:
            backend = setup_backend(kind, stack, workdir)
        except SetupError as exc:
            print(f"demo: cannot set up the {kind} backend: {exc}", file=sys.stderr)
            return 2
        say(f"aioelect demo: {args.instances} scheduler instances, backend {kind} ({backend.where})")
        say(settings_line(backend))
        say(f"each instance: {sys.executable} {os.path.relpath(SCHEDULER)} --instance scheduler-N")
        say("")
        demo = Demo(backend, workdir, args.instances, args.kill_after, args.run_after)
        outcome = asyncio.run(_main(demo, args.timeout))
        summary = analyse(demo, outcome == "finished")
        print_summary(summary)
        if outcome == "failed":
            tails = demo.log_tails()
            if tails:
                say("\n" + tails)
        if args.summary_json:
            with open(args.summary_json, "w") as fh:
                json.dump(summary, fh, indent=2)
    if outcome == "interrupted":
        return 128 + signal.SIGINT
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
