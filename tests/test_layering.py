"""The arrows between the elector and its backends run one way.

The elector calls its backend and hands it a reporter; it never writes into
it. A backend's module, and its driver, load only when that backend is used.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import aioelect
from aioelect.core._backend import Backend, Confirm, Hold, Reporter, monotonic
from aioelect.core._events import Event

ROOT = Path(__file__).resolve().parent.parent


class _SealedHold(Hold):
    def __init__(self) -> None:
        self.token = 1
        self.acquired_at = monotonic()
        self.released = False

    async def monitor(self, confirm: Confirm) -> str:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def release(self) -> None:
        self.released = True


class _SealedBackend(Backend):
    """A backend that refuses every attribute written from outside its own methods, once built."""

    kind = "sealed"

    def __init__(self) -> None:
        super().__init__("sealed/election")
        self.attached: list[Reporter] = []
        self.warnings.append("sealed: what these options give up")
        self._sealed = True

    def __setattr__(self, name: str, value: Any) -> None:
        # Only the backend's own methods (its class's or Backend's) may write its attributes.
        writer = sys._getframe(1).f_locals.get("self")
        if getattr(self, "_sealed", False) and writer is not self:
            raise AssertionError(f"{type(writer).__name__} wrote {name!r} into the backend")
        super().__setattr__(name, value)

    def attach(self, reporter: Reporter) -> None:
        self.attached.append(reporter)
        super().attach(reporter)

    async def campaign(self, identity: str) -> Hold:
        await anyio.lowlevel.checkpoint()
        self.report_error("server hiccup", 0.0)
        return _SealedHold()

    async def leader(self) -> str | None:
        return None

    async def observe(self) -> AsyncIterator[str | None]:
        yield None


async def test_the_elector_never_writes_into_its_backend(caplog: pytest.LogCaptureFixture) -> None:
    backend = _SealedBackend()
    events: list[Event] = []
    elector = aioelect.Elector(backend, identity="me")
    elector.add_listener(events.append)
    lead = await elector.acquire()
    assert lead.held
    await lead.release()
    async for _ in elector.observe():
        break
    await elector.aclose()
    # It was handed one reporter, and reported through it: the elector's log and an error event.
    assert len(backend.attached) == 1 and backend.log is backend.attached[0].log
    assert [e.reason for e in events if e.kind == "error"] == ["server hiccup"]
    hiccup = [r for r in caplog.records if "server hiccup" in r.getMessage()]
    assert hiccup and all(getattr(r, "identity", None) == "me" for r in hiccup)
    # What the options give up is logged once, by the elector, with its identity.
    given_up = [r for r in caplog.records if "what these options give up" in r.getMessage()]
    assert len(given_up) == 1 and given_up[0].levelname == "WARNING" and getattr(given_up[0], "identity", None) == "me"


def _fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_aioelect_loads_no_backend_and_no_driver() -> None:
    loaded = _fresh(
        "import sys, aioelect\n"
        "print(sorted(m for m in sys.modules if m.startswith('aioelect.backends.') "
        "or m.split('.')[0] in ('aiomysql', 'pymysql', 'asyncpg', 'aetcd', 'grpc')))\n"
    )
    assert loaded == "[]"


def test_a_backend_loads_when_its_elector_is_built(tmp_path: Path) -> None:
    loaded = _fresh(
        "import sys, aioelect\n"
        f"aioelect.FileElector({str(tmp_path / 'l.lock')!r})\n"
        # The backends themselves (a backend package's own modules are not other backends).
        "print(sorted(m for m in sys.modules if m.startswith('aioelect.backends.') and m.count('.') == 2))\n"
    )
    assert loaded == "['aioelect.backends.file']"


def test_a_missing_driver_names_its_extra() -> None:
    shown = _fresh(
        "import sys\n"
        "sys.modules['aiomysql'] = None\n"
        "import aioelect\n"
        "try:\n"
        "    aioelect.MySQLElector\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "from aioelect import LocalElector\n"
        "print(type(LocalElector()).__name__)\n"
    )
    assert shown.splitlines() == ["the MySQL backend needs aiomysql: pip install 'aioelect[mysql]'", "LocalElector"]


@pytest.mark.parametrize(
    ("options", "who", "unknown"),
    [
        # Another backend's own options (not the portable timing of tests/test_portable_options.py).
        ({"local": True, "ssl": None}, "LocalElector", "ssl"),
        ({"file": "l.lock", "fencing": True}, "FileElector", "fencing"),
        ({"file": "l.lock", "name": "n", "schema": "s"}, "FileElector", "schema"),
    ],
)
def test_an_option_the_backend_does_not_take_is_a_type_error(
    tmp_path: Path, options: dict[str, Any], who: str, unknown: str
) -> None:
    if "file" in options:
        options["file"] = str(tmp_path / options["file"])
    with pytest.raises(TypeError, match=rf"^{who}\(\) got an unexpected keyword argument '{unknown}'$"):
        aioelect.new(**options)
