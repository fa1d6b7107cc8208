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

    @staticmethod
    def _prefix(extra: MutableMapping[str, Any]) -> str:
        return f"[{extra['backend']} {extra['election']} {extra['identity']}]"

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """As :meth:`logging.LoggerAdapter.log`; a '%' of the prefix (an election name may hold one) is kept as
        it is when the message is formatted with ``args``."""
        if not self.isEnabledFor(level):
            return
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        prefix = self._prefix(extra)
        if args:
            prefix = prefix.replace("%", "%%")
        # One frame more than LoggerAdapter's (which logging skips as its own): records point at our caller.
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
        self.logger.log(level, f"{prefix} {msg}", *args, **kwargs)
