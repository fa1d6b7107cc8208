"""etcd backend: etcd's own election algorithm (Go ``client/v3/concurrency``) over gRPC.

What the wiring layer uses: :class:`EtcdBackend`, :class:`EtcdOptions`,
:class:`EtcdSession` (public as ``aioelect.EtcdSession``) and
:func:`parse_endpoints`. Inside, one module per job, each importing only
those listed after it:

* ``_backend``: the backend: campaigns with sessions;
* ``_hold``: the held leadership, watched and released;
* ``_leases``: whose lease a campaign runs under (its own, or a shared session's);
* ``_shared``: one session shared by several electors (:class:`EtcdSession`);
* ``_degraded``: local leadership while etcd has never answered (opt-in);
* ``_election``: the Go-compatible keys, ``leader()`` and ``observe()``;
* ``_session``: a lease kept alive (Go's ``Session``);
* ``_keepalive``: the one keep-alive stream every lease renews on;
* ``_connection``: requests and watches, failover between endpoints;
* ``_watch``: one watch stream and what its responses mean;
* ``_channel``: one gRPC channel to one endpoint, authenticated;
* ``_options``: the options, validated;
* ``_probe``: why a connection failed (a TLS handshake of our own);
* ``_tls``: TLS files and credentials;
* ``_candidacy``: the states of a campaign and the table of its steps;
* ``_calls``, ``_failures``, ``_endpoints``: awaiting gRPC under anyio,
  how a request failed (classified once into a ``Failure``), where etcd is.

aetcd is used only for the etcd API it ships generated (:mod:`aetcd.rpc`)
and :func:`aetcd.utils.prefix_range_end`; no private name of aetcd is used.
"""

from __future__ import annotations

try:
    import aetcd.rpc  # noqa: F401 - the etcd API every module here uses
    import grpc  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the etcd backend needs aetcd: pip install 'aioelect[etcd]'") from exc

from ._backend import EtcdBackend
from ._endpoints import parse_endpoints
from ._options import EtcdOptions, EtcdSessionOptions
from ._shared import EtcdSession

__all__ = ["EtcdBackend", "EtcdOptions", "EtcdSession", "EtcdSessionOptions", "parse_endpoints"]
