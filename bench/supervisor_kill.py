"""How long CMD's process tree outlives an ``aioelect run`` killed with SIGKILL.

``python -m bench.supervisor_kill [--runs N]``

Each run starts ``aioelect run --file L -- python TREE`` where TREE leaves
a child in its process group, one in a session of its own and a
double-forked grandchild (each ignoring every catchable signal), lists every
descendant of the supervisor (the shim, CMD and the three), SIGKILLs the
supervisor and polls ``/proc`` until none of them is alive (a zombie counts
as dead). Prints one line per run and the median and maximum, in
milliseconds, as JSON on the last line. Every run is bounded in time and
leaves nothing running.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TREE = """\
import os, subprocess, sys
stubborn = ["sh", "-c", 'trap "" TERM INT HUP QUIT USR1 USR2 PIPE; exec sleep 300']
subprocess.Popen(stubborn)
subprocess.Popen(stubborn, start_new_session=True)
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        os.execvp("sh", stubborn)
    os._exit(0)
os.wait()
with open(sys.argv[1], "w") as fh:
    fh.write("up")
import signal
signal.pause()
"""


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(int(entry))) is not None:
            children.setdefault(found[1], []).append(int(entry))
    result, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            result.append(child)
            todo.append(child)
    return result


def alive(pid: int) -> bool:
    found = _stat(pid)
    return found is not None and found[0] != "Z"


def one_run(tmp: Path, n: int) -> float:
    script, up = tmp / "tree.py", tmp / f"up-{n}"
    script.write_text(TREE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "aioelect", "run", "-q", "--file", str(tmp / "lock"), "--",
            sys.executable, str(script), str(up)]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, cwd=ROOT)
    tree: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not up.exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("CMD's tree did not start")
            time.sleep(0.01)
        tree = descendants(proc.pid)
        if len(tree) < 5:  # the shim, CMD, and its three
            time.sleep(0.1)
            tree = descendants(proc.pid)
        started = time.monotonic()
        proc.kill()
        while any(alive(pid) for pid in tree):
            if time.monotonic() - started > 10:
                raise RuntimeError(f"CMD's tree outlived the supervisor by 10s: {tree}")
            time.sleep(0.0005)
        return time.monotonic() - started
    finally:
        proc.kill()
        proc.wait(10)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.runs):
            took = one_run(Path(tmp), n)
            times.append(took * 1000)
            print(f"run {n + 1}: the tree was gone {took * 1000:.1f} ms after SIGKILL of the supervisor")
    summary = {"runs": len(times), "median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
