"""aioelect's MySQL/MariaDB backend: acting as leader means ``Leadership.held``."""

from __future__ import annotations

from aioelect import Elector, Leadership, MySQLElector

from ._runner import Candidate, Options, main


class AioelectCandidate(Candidate):
    """Any aioelect elector: ``acquire()``, ``held``, ``release()``."""

    def __init__(self, elector: Elector) -> None:
        self.elector = elector
        self.lead: Leadership | None = None

    async def campaign(self) -> None:
        self.lead = await self.elector.acquire()

    def acting(self) -> bool:
        return self.lead is not None and self.lead.held

    async def release(self) -> None:
        lead, self.lead = self.lead, None
        if lead is not None:
            await lead.release()

    async def close(self) -> None:
        await self.elector.aclose()


def make(options: Options, slot: int) -> Candidate:
    lease = {} if options.lease is None else {"lease": options.lease}
    return AioelectCandidate(MySQLElector(options.url, name=options.name, **lease))


if __name__ == "__main__":
    main(make)
