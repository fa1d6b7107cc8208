"""aioelect._early: stop signals received while the command starts are kept for it, and nothing else changes."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """\
import os, signal, sys
from aioelect import _early
signal.signal(signal.SIGUSR2, signal.SIG_IGN)   # ignored before: stays ignored
signal.signal(signal.SIGHUP, signal.SIG_DFL)    # default before (not inherited: nohup ignores it), default after
_early.hold()
os.kill(os.getpid(), signal.SIGTERM)            # a stop signal while starting: kept
os.kill(os.getpid(), signal.SIGUSR2)            # ignored: dropped as before
assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
got = _early.take({signal.SIGTERM, signal.SIGINT})
print("taken", [s.name for s in got], flush=True)
assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL  # not handled by the command: the default is back
_early.hold()
os.kill(os.getpid(), signal.SIGHUP)             # received while starting, not handled: its default action now
_early.take({signal.SIGTERM})
print("not reached", flush=True)
"""


def test_held_signals_are_taken_by_the_command_and_the_others_act_as_before() -> None:
    run = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=30)
    assert run.stdout.splitlines() == ["taken ['SIGTERM']"], run.stdout + run.stderr
    assert run.returncode == -1, run.stderr  # SIGHUP's default action ended it (-SIGHUP)


def test_importing_aioelect_loads_nothing_else() -> None:
    """``import aioelect`` is cheap (the names load on first use), so that the command takes its stop signals
    before the rest is imported."""
    code = "import sys, aioelect; print(sorted(m for m in sys.modules if m.startswith(('aioelect', 'anyio'))))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert run.stdout.strip() == "['aioelect', 'aioelect.core', 'aioelect.core._errors']", run.stdout
