-- Grant a lease if it is free, with a fencing token, in one step.
-- KEYS[1]  the lease hash   {prefix:name}:lease  (token, holder, fence, acquired)
-- KEYS[2]  the fence counter {prefix:name}:fence (no expiry)
-- ARGV[1]  token   ARGV[2]  ttl in milliseconds   ARGV[3]  holder id
-- Returns the fencing token (integer), or false when a live lease exists.
-- The token is never below the server's TIME in microseconds, so a Redis that
-- restarted empty (no persistence) still hands out larger tokens than before.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local fence = tonumber(redis.call('GET', KEYS[2]) or '0') + 1
if fence < now_us then
  fence = now_us
end
redis.call('SET', KEYS[2], string.format('%d', fence))
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'holder', ARGV[3],
           'fence', string.format('%d', fence), 'acquired', now[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
