"""aioelect's etcd backend with one shared session per process (opt-in ``EtcdSession``, TTL 5 s).

Every slot of the process is an ``EtcdElector(session=..., name=...)`` on one
``EtcdSession``: one lease and one keep-alive stream for the whole process,
whatever the number of elections. Acting as leader means ``Leadership.held``.
The session opens with the first slot and closes after the last.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aioelect

from ._runner import Candidate, Options, main
from .aioelect_mysql import AioelectCandidate

_lock = asyncio.Lock()
_session: Any = None
_users = 0


class SharedSessionCandidate(AioelectCandidate):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.elector: Any = None
        self.lead = None

    async def setup(self) -> None:
        global _session, _users
        async with _lock:
            if _session is None:
                session = self.new_session()
                await session.__aenter__()
                _session = session
            _users += 1
        self.elector = self.new_elector(_session)

    def new_session(self) -> Any:
        """The process's shared session, not entered yet."""
        return aioelect.EtcdSession([self.options.url], ttl=self.options.ttl)

    def new_elector(self, session: Any) -> Any:
        """This slot's elector on the shared ``session``."""
        return aioelect.EtcdElector(session=session, name=self.options.name)

    async def close(self) -> None:
        global _session, _users
        if self.elector is not None:
            await self.elector.aclose()
        async with _lock:
            _users -= 1
            if _users == 0 and _session is not None:
                session, _session = _session, None
                await session.aclose()


def make(options: Options, slot: int) -> Candidate:
    return SharedSessionCandidate(options)


if __name__ == "__main__":
    main(make)
