"""Draw the state diagrams in the docs from the transition tables in the code.

Each diagram sits in a page between ``<!-- states: NAME -->`` and
``<!-- /states -->``, as a mermaid block drawn by
:meth:`aioelect.core._transitions.Transitions.mermaid`. ``python
scripts/state_diagrams.py`` rewrites them; tests/test_docs.py fails when a
committed diagram differs from its table, so a diagram cannot drift.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from aioelect.core._elector import ELECTOR_TRANSITIONS, LEADERSHIP_TRANSITIONS
from aioelect.core._transitions import Transitions
from aioelect.backends.etcd._candidacy import CANDIDACY_TRANSITIONS

ROOT = Path(__file__).resolve().parent.parent

#: Each diagram: the page it is drawn in, and the table it is drawn from.
DIAGRAMS: dict[str, tuple[str, Transitions]] = {  # type: ignore[type-arg]
    "elector": ("docs/concepts.md", ELECTOR_TRANSITIONS),
    "leadership": ("docs/concepts.md", LEADERSHIP_TRANSITIONS),
    "etcd-campaign": ("docs/backends.md", CANDIDACY_TRANSITIONS),
}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- states: {re.escape(name)} -->\n)(.*?)(<!-- /states -->)", re.DOTALL)


def drawn(name: str) -> str:
    """The block the page must hold for diagram ``name``."""
    return "```mermaid\n" + DIAGRAMS[name][1].mermaid() + "```\n"


def committed(name: str) -> str | None:
    """The block the page holds now for diagram ``name``, or None when it has no place for it."""
    found = _block(name).search((ROOT / DIAGRAMS[name][0]).read_text())
    return found.group(2) if found else None


def main() -> int:
    for name, (page, _) in DIAGRAMS.items():
        path = ROOT / page
        block = drawn(name)
        text, count = _block(name).subn(lambda m, b=block: m.group(1) + b + m.group(3), path.read_text())
        if count != 1:
            print(f"{page}: no single '<!-- states: {name} -->' ... '<!-- /states -->' place", file=sys.stderr)
            return 1
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
