"""Redis backend: a lock key with an expiry renewed by its owner, a fencing token beside it (redis-py asyncio).

What the wiring layer uses: :class:`RedisBackend` and :class:`RedisOptions`.
Inside, one module per job:

* ``_backend``: the backend and its hold (campaign, renew, release, leader);
* ``_scripts``: the Lua scripts, one atomic step each;
* ``_options``: the URL and the options, validated.

redis-py's asyncio client also speaks to Valkey.
"""

from __future__ import annotations

try:
    import redis.asyncio  # noqa: F401 - the client every module here uses
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("the Redis backend needs redis-py: pip install 'aioelect[redis]'") from exc

from ._backend import RedisBackend, RedisHold, identity_of
from ._options import RedisOptions

__all__ = ["RedisBackend", "RedisHold", "RedisOptions", "identity_of"]
