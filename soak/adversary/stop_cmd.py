"""CMD of the stopped-processes workload (:mod:`soak.adversary.stops`): the work ``aioelect run`` supervises.

``python -I -S stop_cmd.py DIR SEED`` runs as CMD (``AIOELECT_IDENTITY`` and
``AIOELECT_TOKEN`` set by ``aioelect run``); it starts two workers, ``python
-I -S stop_cmd.py DIR SEED worker ROLE``: ``child`` (in CMD's process group)
and ``setsid`` (a session of its own). Standard library only, so it starts in
milliseconds under any ``aioelect``.

Every process of the tree writes heartbeats to ``DIR/WHO-TOKEN-ROLE-PID.jsonl``
every 20-50 ms: a first line ``{"pid", "ppid", "role", "who", "token", "t"}``,
then ``{"t"}`` (``time.monotonic_ns()``, system-wide on Linux). A heartbeat
is work done under that leadership: the checker finds when each tree
worked.

What CMD does is drawn from ``SEED``, the identity and the token: whether
its workers ignore SIGTERM (they then end only by SIGKILL), whether and
when it stops its own shim (``kill -STOP $PPID``; noted as ``{"e":
"stop-shim"}``), and whether and when it exits by itself (``aioelect run
--forever`` then ends what is left of the tree, releases and campaigns
again).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

#: The share of CMDs that stop their own shim, and of those that exit by themselves.
STOP_SHIM = 0.7
EXITS = 0.5


class Beats:
    def __init__(self, directory: str, role: str) -> None:
        who, token = os.environ.get("AIOELECT_IDENTITY", "?"), os.environ.get("AIOELECT_TOKEN", "")
        path = os.path.join(directory, f"{who}-{token or 0}-{role}-{os.getpid()}.jsonl")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        first = {"pid": os.getpid(), "ppid": os.getppid(), "role": role, "who": who, "token": int(token or 0)}
        self.write(first)

    def write(self, fields: dict[str, object]) -> None:
        fields["t"] = time.monotonic_ns()
        os.write(self._fd, (json.dumps(fields) + "\n").encode())


def worker(directory: str, seed: str, role: str) -> None:
    rng = random.Random(f"{seed}:{role}:{os.getpid()}")
    beats = Beats(directory, role)
    while True:
        beats.write({})
        time.sleep(rng.uniform(0.02, 0.05))


def cmd(directory: str, seed: str) -> None:
    who, token = os.environ.get("AIOELECT_IDENTITY", "?"), os.environ.get("AIOELECT_TOKEN", "")
    rng = random.Random(f"{seed}:{who}:{token}")
    beats = Beats(directory, "cmd")
    stubborn = rng.random() < 0.5
    stop_at = rng.uniform(0.05, 1.5) if rng.random() < STOP_SHIM else None
    exit_at = rng.uniform(0.5, 5.0) if rng.random() < EXITS else None
    here = os.path.abspath(__file__)

    def start(role: str, new_session: bool) -> None:
        argv = [sys.executable, "-I", "-S", here, directory, seed, "worker", role]
        handler = signal.SIG_IGN if stubborn else signal.SIG_DFL
        subprocess.Popen(argv, start_new_session=new_session, preexec_fn=lambda: signal.signal(signal.SIGTERM, handler))

    start("child", False)
    start("setsid", True)
    began = time.monotonic()
    while True:
        beats.write({})
        now = time.monotonic() - began
        if stop_at is not None and now >= stop_at:
            stop_at = None
            beats.write({"e": "stop-shim", "shim": os.getppid()})
            os.kill(os.getppid(), signal.SIGSTOP)  # kill -STOP $PPID: the shim
        if exit_at is not None and now >= exit_at:
            os._exit(0)  # the workers run on: aioelect run ends them before it lets go
        time.sleep(rng.uniform(0.02, 0.05))


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[3] == "worker":
        worker(sys.argv[1], sys.argv[2], sys.argv[4])
    else:
        cmd(sys.argv[1], sys.argv[2])
