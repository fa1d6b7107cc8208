"""One member of a tooz Partitioner (etcd3gw driver) over the same names, reporting what it believes it owns.

tooz's Partitioner is a hash ring over the group's members: ``belongs_to_self(name)`` is this member's own
view, with no lock behind it. The member runs ``run_watchers()`` every ``--interval`` seconds (as tooz's users
do) and reports each change of its view as ``own``/``drop`` lines, like aioelect_member.py.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from tooz import coordination


def emit(ev: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"ev": ev, "t": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


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
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--names", type=int, required=True)
    parser.add_argument("--ttl", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.2)
    main(parser.parse_args())
