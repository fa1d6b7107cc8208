"""``python -m aioelect`` (and the ``aioelect`` script): the ``aioelect`` command (see :mod:`aioelect.cli`)."""

from __future__ import annotations

from ._early import hold

hold()  # before the rest of the package is imported: a stop signal meanwhile is kept, not dropped

from .cli import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
