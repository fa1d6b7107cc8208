"""etcd backend: etcd's own election algorithm (Go ``client/v3/concurrency``) on aetcd.

``session.py`` holds the connection (failover between endpoints) and the
lease session; ``election.py`` the backend: its options, the campaign, the
held leadership, ``leader()`` and ``observe()``.
"""

from __future__ import annotations

from .election import EtcdBackend, EtcdOptions
from .session import parse_endpoints

__all__ = ["EtcdBackend", "EtcdOptions", "parse_endpoints"]
