-- Extend every live permit of a batch, in one step (tenure.stores.semaphores).
-- KEYS[i]      the permit expiries of item i's semaphore (one hash slot per call on a cluster)
-- ARGV[2i-1]   the token of item i   ARGV[2i]  its ttl in milliseconds
-- Returns a list of 1 (extended) or 0 (gone or lapsed), in order.
local ms = now_ms()
local out = {}
for i, key in ipairs(KEYS) do
  local token = ARGV[2 * i - 1]
  local expires = redis.call('ZSCORE', key, token)
  if expires and tonumber(expires) > ms then
    redis.call('ZADD', key, ms + tonumber(ARGV[2 * i]), token)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
