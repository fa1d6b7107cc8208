"""One member of a tooz Partitioner (etcd3gw driver) over the same names, reporting what it believes it owns.

tooz's Partitioner is a hash ring over the group's members: ``belongs_to_self(name)`` is this member's own
view, with no lock behind it. The member runs ``run_watchers()`` every ``--interval`` seconds (as tooz's users
do) and reports each change of its view as ``own``/``drop`` lines, like aioelect_member.py.
"""

from __future__ import annotations

import argparse
import signal
import threading

from tooz import coordination

from bench.shards_members._common import arguments, emit


def main(args: argparse.Namespace) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    url = f"etcd3+http://{args.endpoint}?timeout={args.ttl}&membership_timeout={args.ttl}"
    coord = coordination.get_coordinator(url, args.identity.encode())
    coord.start(start_heart=True)
    group = args.group.encode()
    emit("ready")
    partitioner = coord.join_partitioned_group(group)
    names = [str(i) for i in range(args.names)]
    owned: set[str] = set()
    while not stop.is_set():
        coord.run_watchers()
        now = {n for n in names if partitioner.belongs_to_self(n)}
        for n in sorted(owned - now):
            emit("drop", name=n)
        for n in sorted(now - owned):
            emit("own", name=n)
        owned = now
        stop.wait(args.interval)
    for n in sorted(owned):
        emit("drop", name=n)
    coord.leave_partitioned_group(partitioner)
    coord.stop()
    emit("left")


if __name__ == "__main__":
    main(arguments(interval=0.2))
