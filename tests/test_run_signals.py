"""``aioelect.run(main())``: SIGTERM and SIGINT cancel ``main`` so that its cleanups run, then end the process."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import aioelect

PROGRAM = """\
import asyncio, sys
import aioelect

async def main() -> None:
    try:
        print("started", flush=True)
        await asyncio.sleep(60)
    finally:
        print("cleaning up", flush=True)
        await asyncio.sleep(float(sys.argv[1]))  # a bounded cleanup, as a release is
        print("cleaned up", flush=True)

aioelect.run(main())
"""


def start(tmp_path: Path, cleanup: float) -> subprocess.Popen[str]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    proc = subprocess.Popen(
        [sys.executable, "-u", str(script), str(cleanup)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    return proc


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc.returncode, out


@pytest.mark.timeout(60)
def test_sigterm_runs_the_cleanups_then_exits_with_128_plus_sigterm(tmp_path: Path) -> None:
    proc = start(tmp_path, 0.2)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc)
    assert code == 128 + signal.SIGTERM, out
    assert "cleaned up" in out and "Traceback" not in out, out


@pytest.mark.timeout(60)
def test_sigint_runs_the_cleanups_then_raises_keyboard_interrupt(tmp_path: Path) -> None:
    proc = start(tmp_path, 0.2)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc)
    assert code == -signal.SIGINT, out  # how Python ends on an uncaught KeyboardInterrupt
    assert "cleaned up" in out and "KeyboardInterrupt" in out, out


@pytest.mark.timeout(60)
def test_a_second_signal_cancels_a_cleanup_that_takes_too_long(tmp_path: Path) -> None:
    proc = start(tmp_path, 60)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "cleaning up"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc)
    assert code == 128 + signal.SIGTERM and "cleaned up" not in out, out


def test_what_main_returns_or_raises_is_passed_through() -> None:
    async def answer() -> int:
        return 42

    async def fail() -> None:
        raise aioelect.UsageError("from main")

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    assert aioelect.run(answer()) == 42
    with pytest.raises(aioelect.UsageError, match="from main"):
        aioelect.run(fail())
    assert {signum: signal.getsignal(signum) for signum in before} == before  # the handlers are put back


def test_outside_the_main_thread_it_runs_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    async def answer() -> int:
        return 7

    results: list[int] = []
    with caplog.at_level(logging.WARNING, logger="aioelect"):
        thread = threading.Thread(target=lambda: results.append(aioelect.run(answer())))
        thread.start()
        thread.join(10)
    assert results == [7]
    assert any("outside the main thread" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ignored", [signal.SIGINT, signal.SIGTERM])
def test_red1_a_signal_the_parent_ignores_stays_ignored(tmp_path: Path, ignored: signal.Signals) -> None:
    """Red team: a shell starts a background job (``app &``) with SIGINT ignored, so that the terminal's Ctrl-C
    stops only the foreground; asyncio.run keeps a SIGINT that is ignored ignored (its handler goes in only over
    Python's default one). aioelect.run installed its handler over SIG_IGN: the background leader was stopped."""
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    proc = subprocess.Popen(
        [sys.executable, "-u", str(script), "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(ignored, signal.SIG_IGN),
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(ignored)
    time.sleep(1.0)
    running = proc.poll() is None
    other = signal.SIGTERM if ignored == signal.SIGINT else signal.SIGINT
    proc.send_signal(other)
    _, out = finish(proc)
    assert running, f"{ignored.name}, ignored by the parent, stopped the program: {out}"
