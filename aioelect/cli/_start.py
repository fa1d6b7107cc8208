"""How CMD is started: under the shim as a :class:`~aioelect.cli._tree.ProcessTree` on Linux, elsewhere as a bare
:class:`~aioelect.cli._supervisor.ProcessGroup`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._supervisor import ProcessGroup, _use_shim
from ._tree import ProcessTree

__all__ = ["start_cmd"]


async def start_cmd(argv: Sequence[str], env: Mapping[str, str], *, hold: Sequence[int] = ()) -> ProcessGroup:
    """Start CMD; FileNotFoundError or another OSError if it cannot be executed.

    ``hold``: descriptors the shim keeps a duplicate of until CMD's whole tree is gone (Linux only).
    """
    if _use_shim():
        return await ProcessTree.start_tree(argv, env, hold=hold)
    return await ProcessGroup.start(argv, env)
