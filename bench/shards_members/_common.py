"""What the instance processes share: their arguments and their report lines."""

from __future__ import annotations

import argparse
import json
import sys
import time


def arguments(**defaults: object) -> argparse.Namespace:
    """The instance's arguments (``defaults`` add or override options with a default)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--names", type=int, required=True)
    parser.add_argument("--ttl", type=int, default=5)
    for option, default in defaults.items():
        parser.add_argument(f"--{option.replace('_', '-')}", type=type(default), default=default)
    return parser.parse_args()


def emit(ev: str, **fields: object) -> None:
    """One report line on stdout: ``ev``, the system-wide monotonic time ``t``, and ``fields``."""
    sys.stdout.write(json.dumps({"ev": ev, "t": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()
