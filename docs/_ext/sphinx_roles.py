"""A griffe extension for the API reference: reStructuredText in docstrings renders as Markdown.

The docstrings name other objects the reStructuredText way (``:class:`Leadership```,
``:meth:`~Elector.acquire```); Markdown has no roles, so each becomes a code span of
the target's name (the ``~`` form keeps its last part, as Sphinx shows it). A
paragraph ending in ``::`` introduces an indented literal block, which Markdown
already shows as code: the ``::`` becomes ``:`` as Sphinx prints it.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|exc|mod|data|obj|const):`(~?)([^`]+)`")
_LITERAL_BLOCK = re.compile(r"(?<=\S)::$", re.M)


def _code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrites every role of a docstring into a Markdown code span, and ``text::`` into ``text:``."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _LITERAL_BLOCK.sub(":", _ROLE.sub(_code, obj.docstring.value))
