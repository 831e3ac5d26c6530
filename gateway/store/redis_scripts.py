"""The Redis store's Lua scripts (``store/redis.py``): the steps that must be atomic, each run by
Redis as one command. A script is handed its keys (KEYS, named by the store's constants, all of one
script's in one hash slot so that it runs on a Redis Cluster too) and its arguments (ARGV), as the
comment above it says, and touches no other key. ``Scripts`` registers them on a client.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

# KEYS: balance, usage, spent, day, carry   ARGV: cost (whole micro-units), time µs, record
#   JSON, keep, key id, the day's field prefix (key id TAB model TAB), prompt tokens, completion
#   tokens, pico-units of the cost below its micro-units (0 to 999999), cache read tokens, cache
#   write tokens (the day's ``h`` and ``w``)
# The carry (pico-units billed and not yet debited, 0 to 999999) of an account that exists takes
# the pico-units; when it reaches a micro-unit, one more is debited, spent and summed for the day.
# Counts go to the commands as the text they came as: Lua's numbers are doubles, exact only to 2^53
SETTLE_LUA = """
if redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[3]) == 0 then return 0 end
local keep = tonumber(ARGV[4])
local n = redis.call('ZCARD', KEYS[2])
if n > keep then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, n - keep - 1) end
local whole = 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('DECRBY', KEYS[1], ARGV[1])
  if ARGV[9] ~= '0' and redis.call('INCRBY', KEYS[5], ARGV[9]) >= 1000000 then
    redis.call('DECRBY', KEYS[5], 1000000)
    redis.call('DECRBY', KEYS[1], 1)
    whole = 1
  end
end
if tonumber(ARGV[1]) ~= 0 then redis.call('HINCRBY', KEYS[3], ARGV[5], ARGV[1]) end
local f = ARGV[6]
redis.call('HINCRBY', KEYS[4], f .. 'r', 1)
redis.call('HINCRBY', KEYS[4], f .. 'p', ARGV[7])
redis.call('HINCRBY', KEYS[4], f .. 'c', ARGV[8])
redis.call('HINCRBY', KEYS[4], f .. '$', ARGV[1])
if ARGV[10] ~= '0' then redis.call('HINCRBY', KEYS[4], f .. 'h', ARGV[10]) end
if ARGV[11] ~= '0' then redis.call('HINCRBY', KEYS[4], f .. 'w', ARGV[11]) end
if whole == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
  redis.call('HINCRBY', KEYS[4], f .. '$', 1)
end
return 1
"""

# KEYS: an instance's holds   ARGV: ttl ms, then account, amount pairs
PUBLISH_HOLDS_LUA = """
redis.call('DEL', KEYS[1])
if #ARGV > 1 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2))
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 1
"""

# KEYS: cooling   ARGV: now ms, then channel, until ms pairs  -> [channel, until, ...] not over
SHARE_COOLING_LUA = """
local now = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local was = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > was then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) <= now then redis.call('HDEL', KEYS[1], all[i])
  else out[#out + 1] = all[i]; out[#out + 1] = all[i + 1] end
end
return out
"""

# KEYS: revoked sessions   ARGV: now, nonce, expires (unix seconds); an entry revoked again ends
# at expires or a second after it did, whichever is later (``Store.revoke_session``)
REVOKE_SESSION_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local was = redis.call('ZSCORE', KEYS[1], ARGV[2])
local ends = tonumber(ARGV[3])
if was and tonumber(was) >= ends then ends = tonumber(was) + 1 end
redis.call('ZADD', KEYS[1], ends, ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then redis.call('EXPIREAT', KEYS[1], last[2]) end
return 1
"""

# KEYS: balance   ARGV: amount   -> new balance, or nil when the account does not exist
TOPUP_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return redis.call('INCRBY', KEYS[1], ARGV[1])
"""

# KEYS: records, by_hash, the owner's keys, users   ARGV: id, key_hash, record JSON, owner (''
#   for none)   -> 0 created, 1 id taken, 2 secret taken, 3 no such owner
CREATE_KEY_LUA = """
if ARGV[4] ~= '' and redis.call('HEXISTS', KEYS[4], ARGV[4]) == 0 then return 3 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return 2 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
if ARGV[4] ~= '' then redis.call('SADD', KEYS[3], ARGV[1]) end
return 0
"""

# KEYS: records (of keys, or of users)   ARGV: id, expected JSON, new JSON   -> 1 written, 0
# changed meanwhile
UPDATE_KEY_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""

# KEYS: records, by_hash, the owner's keys   ARGV: id   -> 1 deleted, 0 absent
DELETE_KEY_LUA = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local h = cjson.decode(v)['key_hash']
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HGET', KEYS[2], h) == ARGV[1] then redis.call('HDEL', KEYS[2], h) end
redis.call('SREM', KEYS[3], ARGV[1])
return 1
"""

# KEYS: users, usernames   ARGV: id, username in lower case, record JSON   -> 0 created, 1 id
#   taken, 2 username taken
CREATE_USER_LUA = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return 2 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
return 0
"""

# KEYS: users, usernames, the user's keys, key records, by_hash   ARGV: id, username in lower
#   case   -> the ids of the keys deleted with the user, or nil when there is no such user
DELETE_USER_LUA = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[2], ARGV[2]) end
local ids = redis.call('SMEMBERS', KEYS[3])
for _, id in ipairs(ids) do
  local v = redis.call('HGET', KEYS[4], id)
  if v then
    local h = cjson.decode(v)['key_hash']
    redis.call('HDEL', KEYS[4], id)
    if redis.call('HGET', KEYS[5], h) == id then redis.call('HDEL', KEYS[5], h) end
  end
end
redis.call('DEL', KEYS[3])
return ids
"""

# KEYS: codes   ARGV: code hash, record JSON pairs   -> 1 added, 0 one was taken (none added)
CREATE_CODES_LUA = """
for i = 1, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then return 0 end
end
for i = 1, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
"""

# Redeeming is two steps because a code and the account it credits live in different slots
# (store/redis.py): the claim, in the codes' slot, happens once per code whoever runs it; the
# credit, in the account's slot, happens once per code whoever runs it (and however often).
#
# KEYS: codes, claims, pending   ARGV: code hash, claim (account TAB user TAB used µs), now µs
#   -> the code's record JSON when this call claimed it; 0 unknown, 1 used, 2 expired
CLAIM_CODE_LUA = """
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then return 0 end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 1 end
local expires = cjson.decode(rec)['expires_us']
if expires and tonumber(expires) <= tonumber(ARGV[3]) then return 2 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[1])
return rec
"""

# KEYS: balance, the account's redeemed codes   ARGV: code hash, amount (micro-units)
#   -> the balance after, or nil when the account does not exist
CREDIT_CODE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then redis.call('INCRBY', KEYS[1], ARGV[2]) end
return redis.call('GET', KEYS[1])
"""

# KEYS: catalogue   ARGV: expected version, number of puts, then field, JSON pairs, then fields
# to delete   -> 1 applied, 0 another edit came first (nothing written)
EDIT_CATALOGUE_LUA = """
local v = redis.call('HGET', KEYS[1], 'version') or '0'
if v ~= ARGV[1] then return 0 end
local last = 2 + 2 * tonumber(ARGV[2])
for i = 3, last, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
for i = last + 1, #ARGV do redis.call('HDEL', KEYS[1], ARGV[i]) end
redis.call('HINCRBY', KEYS[1], 'version', 1)
return 1
"""


@dataclass(frozen=True, slots=True)
class Scripts:
    """The scripts registered on one client (sent by their SHA; loaded first when Redis does not
    know them yet)."""

    settle: AsyncScript
    share_cooling: AsyncScript
    publish_holds: AsyncScript
    topup: AsyncScript
    create_key: AsyncScript
    update_key: AsyncScript
    delete_key: AsyncScript
    edit_catalogue: AsyncScript
    revoke_session: AsyncScript
    create_user: AsyncScript
    update_user: AsyncScript
    delete_user: AsyncScript
    create_codes: AsyncScript
    claim_code: AsyncScript
    credit_code: AsyncScript

    @classmethod
    def register(cls, client: aioredis.Redis) -> Scripts:
        return cls(
            settle=client.register_script(SETTLE_LUA),
            share_cooling=client.register_script(SHARE_COOLING_LUA),
            publish_holds=client.register_script(PUBLISH_HOLDS_LUA),
            topup=client.register_script(TOPUP_LUA),
            create_key=client.register_script(CREATE_KEY_LUA),
            update_key=client.register_script(UPDATE_KEY_LUA),
            delete_key=client.register_script(DELETE_KEY_LUA),
            edit_catalogue=client.register_script(EDIT_CATALOGUE_LUA),
            revoke_session=client.register_script(REVOKE_SESSION_LUA),
            create_user=client.register_script(CREATE_USER_LUA),
            update_user=client.register_script(UPDATE_KEY_LUA),
            delete_user=client.register_script(DELETE_USER_LUA),
            create_codes=client.register_script(CREATE_CODES_LUA),
            claim_code=client.register_script(CLAIM_CODE_LUA),
            credit_code=client.register_script(CREDIT_CODE_LUA),
        )
