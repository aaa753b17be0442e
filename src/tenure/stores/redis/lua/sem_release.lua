-- Give a permit back, or leave the queue (tenure.stores.semaphores).
-- KEYS the first four of _sem.lua's   ARGV[1] token   ARGV[2] the semaphore's channel
-- Returns 1 when a live permit of token was removed, else 0. Publishes on
-- the channel when it removed something and others are queued.
local ms = now_ms()
local token = ARGV[1]
local expires = redis.call('ZSCORE', KEYS[2], token)
local removed = false
if expires then
  redis.call('ZREM', KEYS[2], token)
  redis.call('HDEL', KEYS[1], token)
  removed = true
elseif redis.call('ZREM', KEYS[3], token) == 1 then
  -- Queued (a grant takes a token out of the queue: never both).
  redis.call('ZREM', KEYS[4], token)
  removed = true
end
if removed and redis.call('ZCARD', KEYS[3]) > 0 then
  redis.call('PUBLISH', ARGV[2], '')
end
if expires and tonumber(expires) > ms then
  return 1
end
return 0
