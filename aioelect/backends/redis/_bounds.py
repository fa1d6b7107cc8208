"""The server settings after which Redis may let a lock go, or break the renews' timing, read with every campaign try.

A Redis lock is a key with an expiry, not a session: a connection the
server closes releases nothing, and the key lives until its ``PX`` expiry
(``lease``, set again by every renew). The timing proof (the leader fences
itself ``renew_deadline`` after the send of its last confirmed renew, and
``renew_deadline < lease``) then holds unless the server deletes the key
sooner, or keeps a healthy leader from renewing in time:

* ``maxmemory`` with an eviction ``maxmemory-policy``: when memory runs out
  the server deletes keys before their expiry, and every policy but
  ``noeviction`` may pick the lock key (``volatile-ttl`` picks the keys
  nearest to expiring first): no bound at all. Refused.
* ``timeout``: the server closes a connection idle for longer. The key
  survives, but a leader whose connection is closed between two renews finds
  every renew failing first and retried on a new connection, so
  confirmations no longer come within ``check_interval + 2 *
  check_timeout``; a waiter's and an observer's requests fail the same way.
  Refused below :func:`least_timeout`. Subscribed connections are exempt.
* ``tcp-keepalive``: the server's probes end a connection to a client that
  stopped answering; that client is cut off anyway, and the key keeps its
  expiry. Never refused, so never read.

``INFO`` gives ``maxmemory``, ``maxmemory_policy`` and ``aof_enabled``;
``timeout`` and ``appendfsync`` only ``CONFIG GET`` gives, or the operator
states them in the URL (``assume_timeout``, ``assume_appendfsync``).
"""

from __future__ import annotations

from collections.abc import Mapping

from ...core._config import LockTiming

__all__ = ["CONFIG_READ", "EXPIRY", "config_problem", "least_timeout", "server_bounds"]

#: What a campaign try reads with ``CONFIG GET`` (the rest is in ``INFO``), unless the URL states it.
CONFIG_READ = ("appendfsync", "timeout")
#: The one server-side bound of a Redis lock, by the name the docs give it.
EXPIRY = "the lock key's PX expiry"
#: Seconds of slack above the longest idle gap of a connection: Redis counts idle time in whole seconds, and a
#: client's next request can leave a little after its interval.
TIMEOUT_SLACK = 1.0


def server_bounds(timing: LockTiming) -> dict[str, float | None]:
    """The server-side bounds of a held lock: only its expiry, which every grant and renew sets to ``lease``."""
    return {EXPIRY: timing.lease}


def least_timeout(timing: LockTiming) -> float:
    """The least ``timeout`` that never closes a connection an elector uses between two of its requests.

    The leader's connection is idle ``check_interval`` between a renew's
    reply and the next renew; a waiter's until the lock key can have expired
    (at most ``lease``: it then reads the key's expiry), or ``poll_interval``
    while the key has none; an observer's between two reads, at most
    ``poll_interval``.
    """
    return max(timing.check_interval, timing.poll_interval, timing.lease) + TIMEOUT_SLACK


def _seconds(config: Mapping[str, str], key: str) -> float:
    try:
        return float(config.get(key, "0") or 0)
    except ValueError:
        return 0.0


def config_problem(config: Mapping[str, str], timing: LockTiming, *, server: str) -> str | None:
    """Why the server's ``config`` (``CONFIG GET`` names -> values) breaks the timing, naming the setting; or None."""
    policy = config.get("maxmemory-policy", "noeviction")
    limited = config.get("maxmemory", "0").strip() not in ("0", "")  # bytes, as CONFIG GET gives them
    if limited and policy != "noeviction":
        return (
            f"Redis at {server} may evict the lock key before its expiry when memory runs out (maxmemory-policy "
            f"{policy} with maxmemory set): another candidate could be granted the lock while the leader still "
            "leads; set maxmemory-policy noeviction (or give the elections a Redis of their own)"
        )
    timeout = _seconds(config, "timeout")
    least = least_timeout(timing)
    if 0 < timeout < least:
        return (
            f"Redis at {server} closes a connection idle for {timeout:g}s (timeout), sooner than the "
            f"{timing.check_interval:g}s between two renews or the up to {max(timing.poll_interval, timing.lease):g}s "
            "a waiting candidate's connection rests (until the lock key can have expired): every renew would fail "
            "first and go out again on a new connection, later than the renew deadline allows for; set timeout to 0 "
            f"or at least {least:g}s on the server (CONFIG SET timeout), or lower check_interval, poll_interval and "
            "lease"
        )
    return None
