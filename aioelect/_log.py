"""Logging with the election's context in every record."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

logger = logging.getLogger("aioelect")


class ElectionLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger adapter that stamps each record with backend, name and identity.

    The three values are both in ``record.backend``, ``record.election`` and
    ``record.identity`` (for structured handlers) and in the message text (for
    plain ones). Callers must never pass secrets: nothing here scrubs them.
    """

    def __init__(self, backend: str, name: str, identity: str) -> None:
        super().__init__(logger, {"backend": backend, "election": name, "identity": identity})

    def rebind(self, **fields: str) -> None:
        assert self.extra is not None
        self.extra = {**self.extra, **fields}

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        prefix = f"[{extra['backend']} {extra['election']} {extra['identity']}]"
        return f"{prefix} {msg}", kwargs
