-- Grant a lease if it is free, with a fencing token, in one step.
-- KEYS[1]  the lease hash   {prefix:name}:lease  (token, holder, fence, acquired)
-- KEYS[2]  the fence counter {prefix:name}:fence (no expiry)
-- ARGV[1]  token   ARGV[2]  ttl in milliseconds   ARGV[3]  holder id
-- Returns the fencing token (integer), or false when a live lease exists.
-- A live lease of this very token (an acquire resent after its answer was
-- lost) is granted again: its fence, its expiry renewed.
-- (grant() comes from _grant.lua, which the store puts in front.)
local current = redis.call('HGET', KEYS[1], 'token')
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'fence'))
end
if current then
  return false
end
return grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
