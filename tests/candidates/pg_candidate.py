"""A PostgreSQL candidate process for tests/test_postgres.py.

Campaigns with :class:`aioelect.PostgresElector` and, while leader, ticks
every ``--act-interval`` seconds. Each tick first reads ``lead.held`` and
reports it; only a tick with ``held`` true counts as leader work ("act"). A
tick that finds ``held`` false ends the leadership (``lead.check()``), so a
leader woken from SIGSTOP must report ``held: false`` before acting again.

Every event is one JSON line on stdout with ``time.monotonic()`` (system-wide
on Linux): ``ready``, ``lead`` (token), ``tick`` (token, held), ``lost``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

from aioelect import LeadershipLost, PostgresElector, leadership


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.monotonic(), **fields}), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--options", default="{}", help="JSON object of PostgresElector options")
    parser.add_argument("--act-interval", type=float, default=0.05)
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(message)s")
    elector = PostgresElector(args.dsn, name=args.name, identity=args.identity, **json.loads(args.options))
    emit("ready")
    async with elector:
        while True:
            try:
                async with leadership(elector) as lead:
                    emit("lead", token=lead.token)
                    while True:
                        held = lead.held  # read before anything else after a wake-up
                        emit("tick", token=lead.token, held=held)
                        lead.check()
                        await asyncio.sleep(args.act_interval)
            except LeadershipLost as exc:
                emit("lost", reason=exc.reason)


if __name__ == "__main__":
    asyncio.run(main())
