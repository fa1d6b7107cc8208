"""Everything the ``aioelect`` command prints, made safe to print.

Guarantees:

* no message on stderr (log lines, errors, argparse's usage errors) holds a
  secret this process was given: DSNs are redacted by text
  (:func:`aioelect.core._config.redact_dsn`) and every registered secret, in
  its plain and URL-quoted forms, is replaced by ``***``;
* nothing printed holds a control or other non-printable character: they
  are escaped, because identities and server messages come from other
  clients and could otherwise move the cursor, rewrite the terminal or
  forge lines;
* every line is flushed at once.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
from urllib.parse import quote, unquote

from ..core._config import dsn_password, redact_dsn

__all__ = ["escape", "json_line", "out", "err", "secrets", "setup_logging", "shown"]

log = logging.getLogger("aioelect.cli")


class Secrets:
    """Every secret this process was given, to scrub from anything it prints."""

    def __init__(self) -> None:
        self._values: set[str] = set()

    def add(self, value: str | None) -> None:
        """Scrub ``value`` (as given, URL-decoded and URL-quoted) from now on; None or empty adds nothing."""
        if value:
            for form in {value, unquote(value)}:
                self._values.update({form, quote(form, safe=""), quote(form)})

    def add_dsn(self, dsn: str | None) -> None:
        """Scrub the password of ``dsn`` (found by text, so even in a DSN that does not parse)."""
        if dsn:
            self.add(dsn_password(dsn))

    def scrub(self, text: str) -> str:
        for value in sorted(self._values, key=len, reverse=True):
            text = text.replace(value, "***")
        return text


#: The secrets of this process.
secrets = Secrets()


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape(text: str) -> str:
    """``text`` with control and other non-printable characters as ``\\xNN``/``\\uNNNN`` escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape_char(c) for c in text)


def shown(text: str) -> str:
    """``text`` as this command may print it: DSNs redacted, secrets scrubbed, non-printables escaped."""
    return escape(secrets.scrub(redact_dsn(text)))


class _ScrubbingFormatter(logging.Formatter):
    """Log lines as :func:`shown` makes them; only a traceback keeps its line breaks."""

    def format(self, record: logging.LogRecord) -> str:
        record = copy.copy(record)
        record.msg, record.args = escape(record.getMessage()), None
        return secrets.scrub(redact_dsn(super().format(record)))


def out(line: str) -> None:
    """One line of data on stdout (identities are not secrets), non-printables escaped, flushed at once."""
    sys.stdout.write(escape(line) + "\n")
    sys.stdout.flush()


def json_line(value: object) -> str:
    """``value`` as one line of JSON in printable ASCII (DEL, which JSON allows raw, escaped too)."""
    return json.dumps(value).replace("\x7f", "\\u007f")


def err(line: str) -> None:
    """One message on stderr: DSNs redacted, secrets scrubbed, non-printables escaped."""
    sys.stderr.write(shown(line) + "\n")
    sys.stderr.flush()


def setup_logging(args: argparse.Namespace) -> None:
    """Send the ``aioelect`` loggers to stderr through the scrubbing formatter, at the level the options ask."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ScrubbingFormatter("aioelect: %(message)s"))
    root = logging.getLogger("aioelect")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(logging.INFO if args.verbose else logging.WARNING)
    log.setLevel(logging.WARNING if args.quiet else logging.INFO)
