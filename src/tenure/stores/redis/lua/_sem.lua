-- Prepended by the store to every semaphore script (tenure.stores.semaphores).
-- A semaphore's keys, under one hash tag:
--   KEYS[1] permits: hash token -> "fence acquired_s holder"
--   KEYS[2] their expiries: zset token -> expires_ms
--   KEYS[3] the queue: zset token -> arrival number (its order)
--   KEYS[4] the queue entries' lives: zset token -> until_ms
--   KEYS[5] the limit   KEYS[6] the fencing counter
-- Lapsed permits and entries are dropped by the next acquire; every reader
-- compares expiries with now, so one not yet dropped is never counted live.

local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), now
end

-- Sends command(key, members...) in chunks: unpack has a bound.
local function each_chunk(command, key, members)
  for i = 1, #members, 1000 do
    redis.call(command, key, unpack(members, i, math.min(i + 999, #members)))
  end
end

-- Drops lapsed permits and queue entries; returns how many are queued then.
local function drop_lapsed(ms)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ms)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ms)
    each_chunk('HDEL', KEYS[1], gone)
  end
  -- The lives hold exactly the queue's members: an empty queue has none.
  local waiting = redis.call('ZCARD', KEYS[3])
  if waiting > 0 then
    local late = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ms)
    if #late > 0 then
      redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ms)
      each_chunk('ZREM', KEYS[3], late)
      waiting = waiting - #late
    end
  end
  return waiting
end
