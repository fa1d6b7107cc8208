"""The Lua scripts: each step of an election is one atomic script on the server.

Keys (one hash tag, so one slot): ``KEYS[1]`` the lock key, whose value is
``<nonce>:<token>:<identity>`` and whose expiry is the lease; ``KEYS[2]`` the
token counter. The nonce is random per campaign: every owner check compares
the value's ``<nonce>:`` prefix, so two candidates with one identity are
never taken for each other.
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "RELEASE", "RENEW", "STATE_WRITE"]

#: ARGV: owner prefix, identity, lease in ms, channel. Returns {token, value, pttl}; token 0: another holds it
#: (value and pttl are its); token -1: the server is not a master (value: the role it reports), nothing written.
#: Our own key (a request of this campaign that ran although its reply was lost) gets its expiry set again.
#: Only a master grants, and it says so in the script that writes: a replica that accepts writes
#: (``replica-read-only no``) or a master demoted since the last request never sets the key nor takes a token.
ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1]) ~= ARGV[1] then
  return {0, held, redis.call('PTTL', KEYS[1])}
end
local role = string.match(redis.call('INFO', 'replication'), 'role:(%w+)')
if role ~= 'master' then
  return {-1, role or 'server of unknown role', 0}
end
if held then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  local token = string.match(held, '^[^:]*:(%d+):')
  return {tonumber(token), held, tonumber(ARGV[3])}
end
local token = redis.call('INCR', KEYS[2])
-- Lua numbers are doubles: a counter past 2^53 would hand two leaders the same token.
if token < 1 or token > 9007199254740991 then
  return redis.error_reply('aioelect: the token counter ' .. KEYS[2] .. ' is out of range (1 to 2^53-1)')
end
local value = ARGV[1] .. token .. ':' .. ARGV[2]
redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], value)
return {token, value, tonumber(ARGV[3])}
"""

#: ARGV: owner prefix, lease in ms, channel. Sets (never adds to) the expiry if the key is ours: 1, else 0. A key
#: gone (deleted or expired: nothing published that) is published as a release, so that the waiters try at once.
RENEW = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not held then
  redis.call('PUBLISH', ARGV[3], '')
end
return 0
"""

#: ARGV: owner prefix, channel. Deletes the key if it is ours and tells the waiters: 1 + the number of subscribers
#: that heard it, else 0 (a key gone is published as a release, as by RENEW).
RELEASE = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1 + redis.call('PUBLISH', ARGV[2], '')
end
if not held then
  redis.call('PUBLISH', ARGV[2], '')
end
return 0
"""


#: Fenced state: ``KEYS[1]`` the token counter, ``KEYS[2]`` the state hash (same slot). ARGV: the writer's token,
#: the field, the value, the mode (``put``, ``absent``: only if the field has no value, ``equal``: only if it holds
#: ARGV[5]). Returns 1 written, 0 fenced (the counter has moved past the token), 2 the value differed, -1 the server is
#: not a master (nothing written: a replica that accepts writes, ``replica-read-only no``, keeps them to itself).
STATE_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local role = string.match(redis.call('INFO', 'replication'), 'role:(%w+)')
if role ~= 'master' then
  return -1
end
if ARGV[4] == 'absent' then
  if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return 2 end
elseif ARGV[4] == 'equal' then
  if redis.call('HGET', KEYS[2], ARGV[2]) ~= ARGV[5] then return 2 end
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""
