"""The candidate processes of one backend: started, signalled, replaced, stopped cleanly, always reaped.

Each candidate reaches the server through proxies of its own and appends
its events to a file of its own; :meth:`Pool.leader` reads the new lines
to tell who acts now.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness import TCPProxy
from tests.harness.processes import pid_alive, popen

from .checker import Act

__all__ = ["Candidate", "Pool"]

_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Candidate:
    identity: str
    proc: subprocess.Popen[bytes]
    proxies: list[TCPProxy]
    events_path: Path
    frozen: bool = False
    busy: bool = False  # a fault holds it
    _offset: int = 0
    last_act: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def poll_events(self) -> None:
        """Read the lines appended since the last call (a partial last line waits for the next)."""
        try:
            with open(self.events_path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.events.append(event)
            if event["e"] == "act":
                self.last_act = max(self.last_act, int(event["t0"]))

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)


class Pool:
    """Starts, replaces and stops the candidates of one backend."""

    def __init__(
        self,
        *,
        backend: str,
        name: str,
        options: dict[str, Any],
        register_dsn: str,
        key: str,
        upstreams: list[tuple[str, int]],
        target_for: Callable[[list[TCPProxy]], str],
        directory: Path,
        seed: int,
        names: tuple[str, ...] = (),
    ) -> None:
        self.backend, self.name, self.options = backend, name, options
        self.register_dsn, self.key = register_dsn, key
        self.upstreams, self.target_for = upstreams, target_for
        self.directory = directory
        self.seed = seed
        #: The shards workload's names: its candidates run ``soak.shards_candidate`` over them.
        self.names = names
        self.all: list[Candidate] = []
        self._count = 0

    def start(self) -> Candidate:
        """A fresh candidate process, with proxies of its own."""
        self._count += 1
        identity = f"c{self._count}"
        proxies = [TCPProxy(host, port) for host, port in self.upstreams]
        events = self.directory / f"{identity}.jsonl"
        argv = [
            sys.executable,
            "-m",
            "soak.shards_candidate" if self.names else "soak.candidate",
            f"--backend={self.backend}",
            f"--target={self.target_for(proxies)}",
            f"--name={self.name}",
            f"--identity={identity}",
            f"--options={json.dumps(self.options)}",
            f"--register={self.register_dsn}",
            f"--key={self.key}",
            f"--events={events}",
            f"--seed={self.seed * 1000 + self._count}",
        ]
        if self.names:
            argv.append(f"--names={','.join(self.names)}")
        env = {**os.environ, "PYTHONPATH": str(_ROOT)}
        proc = popen(argv, log_path=str(self.directory / f"{identity}.log"), env=env, cwd=str(_ROOT))
        candidate = Candidate(identity, proc, proxies, events)
        self.all.append(candidate)
        return candidate

    def live(self) -> list[Candidate]:
        return [c for c in self.all if c.alive()]

    def leader(self, within: float = 0.5) -> Candidate | None:
        """The live, unfrozen candidate that acted last, if it acted in the last ``within`` seconds."""
        now = time.monotonic_ns()
        best: Candidate | None = None
        for candidate in self.live():
            candidate.poll_events()
            if candidate.frozen or now - candidate.last_act > within * 1e9:
                continue
            if best is None or candidate.last_act > best.last_act:
                best = candidate
        return best

    def wait_leader(self, timeout: float) -> Candidate | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.leader()
            if found is not None:
                return found
            time.sleep(0.1)
        return None

    def kill(self, candidate: Candidate) -> None:
        """SIGKILL (woken first, in case it is frozen) and reap; its proxies close."""
        candidate.signal(signal.SIGCONT)
        candidate.signal(signal.SIGKILL)
        try:
            candidate.proc.wait(timeout=10)
        finally:
            for proxy in candidate.proxies:
                proxy.close()

    def stop_all(self, timeout: float) -> list[str]:
        """SIGTERM every live candidate and wait for its clean exit; SIGKILL what does not exit in ``timeout``.

        Returns the candidates that had to be killed, as sentences.
        """
        problems = []
        for candidate in self.live():
            candidate.signal(signal.SIGCONT)
            candidate.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for candidate in self.all:
            try:
                candidate.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                problems.append(f"{candidate.identity} did not exit within {timeout:.0f}s of SIGTERM (killed)")
                self.kill(candidate)
            for proxy in candidate.proxies:
                proxy.close()
        return problems

    def close(self) -> None:
        """Kill and reap everything still alive (the cleanup of last resort)."""
        for candidate in self.all:
            if candidate.alive():
                self.kill(candidate)
            for proxy in candidate.proxies:
                proxy.close()

    def still_running(self) -> list[str]:
        return [f"candidate {c.identity} (pid {c.proc.pid}) still running" for c in self.all if pid_alive(c.proc.pid)]

    def acts(self) -> list[Act]:
        found = []
        for candidate in self.all:
            candidate.poll_events()
            for e in candidate.events:
                if e["e"] == "act":
                    found.append(
                        Act(
                            candidate.identity,
                            e.get("token"),
                            int(e["t0"]),
                            int(e["t1"]),
                            e.get("ok"),
                            e.get("name", ""),
                        )
                    )
        return found

    def exit_reports(self, stopped: set[str]) -> list[str]:
        """Leftovers reported by the candidates that were stopped cleanly: tasks alive at exit, or no report."""
        found = []
        for candidate in self.all:
            if candidate.identity not in stopped:
                continue
            candidate.poll_events()
            exits = [e for e in candidate.events if e["e"] == "exit"]
            if not exits:
                found.append(
                    f"{candidate.identity} exited without its exit report (status {candidate.proc.returncode})"
                )
            elif exits[-1]["tasks"]:
                found.append(f"{candidate.identity} left asyncio tasks at its clean exit: {exits[-1]['tasks']}")
        return found
