-- Prepended (after _grant.lua) to the scripts that acquire a lease without
-- queueing (acquire, start).
-- acquire(lease, fence_key, token, ttl_ms, holder): grant the lease if it is
-- free; returns its fencing token, or false when a live lease exists. A live
-- lease of this very token (an acquire resent after its answer was lost) is
-- granted again: its fence, its expiry renewed.
local function acquire(lease, fence_key, token, ttl_ms, holder)
  local current = redis.call('HGET', lease, 'token')
  if current == token then
    redis.call('PEXPIRE', lease, ttl_ms)
    return tonumber(redis.call('HGET', lease, 'fence'))
  end
  if current then
    return false
  end
  return grant(lease, fence_key, token, ttl_ms, holder)
end
