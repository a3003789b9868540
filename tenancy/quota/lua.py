"""The Redis quota scripts. One EVALSHA per admission and one per settlement, so every decision
is atomic across any number of gateway processes.

Key layout per subject (8 keys, in this order):
  win    ZSET  request id -> admitted-at (s)      requests in the sliding 60 s window
  tok    HASH  request id -> tokens               tokens of the requests in the window
  sum    STR   total of tok
  lease  ZSET  request id -> lease expiry (s)     concurrency leases
  day    STR   tokens charged this UTC day
  month  STR   tokens charged this UTC month
  dc     STR   micro-units of the currency charged this UTC day
  mc     STR   micro-units of the currency charged this UTC month
plus, first of all, a marker key per request (exists from admission until settlement): an
admission replayed while it exists answers admitted again and counts nothing.
Every key of one call carries the same hash tag (quota_redis.py), so a Redis Cluster runs the
script on one slot.
Times come from the caller's clock, so replicas must keep NTP time; skew only moves window edges.
Replies carry integers only (Redis truncates Lua floats), so times travel as milliseconds.
"""

from __future__ import annotations

_PURGE = r"""
-- Drops window entries at or before now - window (in chunks, to keep unpack small) and
-- expired leases. Expects `now` and `window` to be set.
local function purge(i)
  local win, tok, sum, lease = KEYS[i], KEYS[i+1], KEYS[i+2], KEYS[i+3]
  while true do
    local old = redis.call('ZRANGEBYSCORE', win, '-inf', now - window, 'LIMIT', 0, 500)
    if #old == 0 then break end
    local freed = 0
    local vals = redis.call('HMGET', tok, unpack(old))
    for j = 1, #old do freed = freed + (tonumber(vals[j]) or 0) end
    redis.call('HDEL', tok, unpack(old))
    redis.call('ZREM', win, unpack(old))
    if freed > 0 then redis.call('DECRBY', sum, freed) end
  end
  redis.call('ZREMRANGEBYSCORE', lease, '-inf', now)
end
"""

_ADMIT = r"""
local rid = ARGV[2]
local reserve = tonumber(ARGV[3])
local lease_expiry = tonumber(ARGV[4])
local to_day_end = tonumber(ARGV[6])
local to_month_end = tonumber(ARGV[7])
local marker_ttl = tonumber(ARGV[8])
local n = tonumber(ARGV[9])
local reserve_micros = tonumber(ARGV[10])

local function oldest_reset_ms(win)
  local first = redis.call('ZRANGE', win, 0, 0, 'WITHSCORES')
  if #first == 0 then return 0 end
  return math.ceil((tonumber(first[2]) + window - now) * 1000)
end

local function tokens_retry_ms(win, tok, excess)
  local entries = redis.call('ZRANGE', win, 0, 999, 'WITHSCORES')
  for j = 1, #entries, 2 do
    excess = excess - (tonumber(redis.call('HGET', tok, entries[j])) or 0)
    if excess <= 0 then return math.ceil((tonumber(entries[j+1]) + window - now) * 1000) end
  end
  return math.ceil(window * 1000)
end

local function states()
  local out = {}
  for s = 0, n - 1 do
    local i = 2 + s * 8
    local count = redis.call('ZCARD', KEYS[i])
    local sum = tonumber(redis.call('GET', KEYS[i+2]) or '0')
    local reset = oldest_reset_ms(KEYS[i])
    table.insert(out, count); table.insert(out, sum); table.insert(out, reset)
  end
  return out
end

-- A replay: this request id is admitted and not yet settled (the caller resent the call after
-- losing its reply on a dropped connection). The admission stands; nothing is counted twice.
if redis.call('EXISTS', KEYS[1]) == 1 then
  local out = {1}
  for _, v in ipairs(states()) do table.insert(out, v) end
  return out
end

for s = 0, n - 1 do purge(2 + s * 8) end

-- limits: 7 per subject after the fixed arguments; -1 means unlimited
for s = 0, n - 1 do
  local i = 2 + s * 8
  local a = 11 + s * 7
  local monthly, daily, monthly_spend, daily_spend, rpm, tpm, conc =
    tonumber(ARGV[a]), tonumber(ARGV[a+1]), tonumber(ARGV[a+2]), tonumber(ARGV[a+3]),
    tonumber(ARGV[a+4]), tonumber(ARGV[a+5]), tonumber(ARGV[a+6])
  local code, retry_ms = nil, 0
  if monthly >= 0 and tonumber(redis.call('GET', KEYS[i+5]) or '0') + reserve > monthly then
    code, retry_ms = 1, math.ceil(to_month_end * 1000)
  elseif daily >= 0 and tonumber(redis.call('GET', KEYS[i+4]) or '0') + reserve > daily then
    code, retry_ms = 2, math.ceil(to_day_end * 1000)
  elseif monthly_spend >= 0
      and tonumber(redis.call('GET', KEYS[i+7]) or '0') + reserve_micros > monthly_spend then
    code, retry_ms = 6, math.ceil(to_month_end * 1000)
  elseif daily_spend >= 0
      and tonumber(redis.call('GET', KEYS[i+6]) or '0') + reserve_micros > daily_spend then
    code, retry_ms = 7, math.ceil(to_day_end * 1000)
  elseif rpm >= 0 and redis.call('ZCARD', KEYS[i]) + 1 > rpm then
    code = 3
    retry_ms = oldest_reset_ms(KEYS[i])
    if retry_ms == 0 then retry_ms = math.ceil(window * 1000) end
  elseif tpm >= 0 and tonumber(redis.call('GET', KEYS[i+2]) or '0') + reserve > tpm then
    code = 4
    retry_ms = tokens_retry_ms(KEYS[i], KEYS[i+1],
      tonumber(redis.call('GET', KEYS[i+2]) or '0') + reserve - tpm)
  elseif conc >= 0 and redis.call('ZCARD', KEYS[i+3]) + 1 > conc then
    code = 5
    local first = redis.call('ZRANGE', KEYS[i+3], 0, 0, 'WITHSCORES')
    retry_ms = 1000
    if #first > 0 then retry_ms = math.min(1000, math.ceil((tonumber(first[2]) - now) * 1000)) end
  end
  if code then
    local out = {0, s, code, retry_ms}
    for _, v in ipairs(states()) do table.insert(out, v) end
    return out
  end
end

local ttl_window = math.ceil(window) + 1
local ttl_lease = math.ceil(lease_expiry - now) + 1
for s = 0, n - 1 do
  local i = 2 + s * 8
  redis.call('ZADD', KEYS[i], now, rid)
  redis.call('HSET', KEYS[i+1], rid, reserve)
  redis.call('INCRBY', KEYS[i+2], reserve)
  redis.call('ZADD', KEYS[i+3], lease_expiry, rid)
  redis.call('INCRBY', KEYS[i+4], reserve)
  redis.call('INCRBY', KEYS[i+5], reserve)
  redis.call('EXPIRE', KEYS[i], ttl_window)
  redis.call('EXPIRE', KEYS[i+1], ttl_window)
  redis.call('EXPIRE', KEYS[i+2], ttl_window)
  redis.call('EXPIRE', KEYS[i+3], ttl_lease)
  redis.call('EXPIRE', KEYS[i+4], math.ceil(to_day_end) + 86400)
  redis.call('EXPIRE', KEYS[i+5], math.ceil(to_month_end) + 86400)
  -- an unpriced request (cost 0) creates no spend keys: nothing to count, nothing to store
  if reserve_micros > 0 then
    redis.call('INCRBY', KEYS[i+6], reserve_micros)
    redis.call('INCRBY', KEYS[i+7], reserve_micros)
    redis.call('EXPIRE', KEYS[i+6], math.ceil(to_day_end) + 86400)
    redis.call('EXPIRE', KEYS[i+7], math.ceil(to_month_end) + 86400)
  end
end
redis.call('SET', KEYS[1], reserve, 'EX', marker_ttl)
local out = {1}
for _, v in ipairs(states()) do table.insert(out, v) end
return out
"""

SETTLE = r"""
local rid = ARGV[1]
local used = tonumber(ARGV[2])
local reserved = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local micros_delta = tonumber(ARGV[5]) - tonumber(ARGV[6])
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
local delta = used - reserved
for s = 0, n - 1 do
  local i = 2 + s * 8
  redis.call('ZREM', KEYS[i+3], rid)
  if redis.call('HEXISTS', KEYS[i+1], rid) == 1 then
    redis.call('HSET', KEYS[i+1], rid, used)
    redis.call('INCRBY', KEYS[i+2], delta)
  end
  if redis.call('EXISTS', KEYS[i+4]) == 1 then redis.call('INCRBY', KEYS[i+4], delta) end
  if redis.call('EXISTS', KEYS[i+5]) == 1 then redis.call('INCRBY', KEYS[i+5], delta) end
  if redis.call('EXISTS', KEYS[i+6]) == 1 then redis.call('INCRBY', KEYS[i+6], micros_delta) end
  if redis.call('EXISTS', KEYS[i+7]) == 1 then redis.call('INCRBY', KEYS[i+7], micros_delta) end
end
return 1
"""

_USAGE = r"""
local win, sum, lease = KEYS[1], KEYS[3], KEYS[4]
purge(1)
-- until the oldest request leaves the window, in ms (0: the window is empty)
local first = redis.call('ZRANGE', win, 0, 0, 'WITHSCORES')
local reset_ms = 0
if #first > 0 then reset_ms = math.ceil((tonumber(first[2]) + window - now) * 1000) end
return {
  redis.call('ZCARD', win),
  tonumber(redis.call('GET', sum) or '0'),
  redis.call('ZCARD', lease),
  tonumber(redis.call('GET', KEYS[5]) or '0'),
  tonumber(redis.call('GET', KEYS[6]) or '0'),
  reset_ms,
  tonumber(redis.call('GET', KEYS[7]) or '0'),
  tonumber(redis.call('GET', KEYS[8]) or '0'),
}
"""

_USAGE_ARGS = r"""
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
"""

_ADMIT_ARGS = r"""
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[5])
"""

ADMIT = _ADMIT_ARGS + _PURGE + _ADMIT
USAGE = _USAGE_ARGS + _PURGE + _USAGE
