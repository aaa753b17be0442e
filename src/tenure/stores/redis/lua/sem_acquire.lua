-- A permit of a semaphore, or a place in its queue (tenure.stores.semaphores).
-- KEYS    see _sem.lua
-- ARGV    token, ttl_ms, holder, limit, queue_ms (0: do not queue)
-- Returns {1, fence} granted, {2, ahead} queued, {0} neither, {-1, limit}
-- when the semaphore is in use with another limit (nothing changed).
local ms, now = now_ms()
local waiting = drop_lapsed(ms)
local token, ttl, limit, queue_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('ZSCORE', KEYS[2], token) then
  -- Its answer was lost and the call resent: the same grant, renewed.
  redis.call('ZADD', KEYS[2], ms + ttl, token)
  return {1, string.match(redis.call('HGET', KEYS[1], token), '^%d+')}
end
local rank = false
if waiting > 0 then
  rank = redis.call('ZRANK', KEYS[3], token)
end
local position, others = waiting, waiting
if rank then
  position, others = rank, waiting - 1
end
local count = redis.call('ZCARD', KEYS[2])
local stored = redis.call('MGET', KEYS[5], KEYS[6])
local current = tonumber(stored[1] or '0')
if count == 0 and others == 0 then
  if current ~= limit then
    redis.call('SET', KEYS[5], ARGV[4])
  end
elseif current ~= limit then
  return {-1, current}
end
if count + position < limit then
  -- Never below the server's TIME in microseconds, as a lock's (see _grant.lua).
  local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local fence = tonumber(stored[2] or '0') + 1
  if fence < now_us then
    fence = now_us
  end
  local fence_text = string.format('%d', fence)
  redis.call('SET', KEYS[6], fence_text)
  redis.call('HSET', KEYS[1], token, fence_text .. ' ' .. now[1] .. ' ' .. ARGV[3])
  redis.call('ZADD', KEYS[2], ms + ttl, token)
  if rank then
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZREM', KEYS[4], token)
  end
  return {1, fence_text}
end
if queue_ms <= 0 then
  return {0}
end
if not rank then
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  redis.call('ZADD', KEYS[3], #last > 0 and tonumber(last[2]) + 1 or 1, token)
end
redis.call('ZADD', KEYS[4], ms + queue_ms, token)
return {2, position}
