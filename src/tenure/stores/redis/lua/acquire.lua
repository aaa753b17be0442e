-- Grant a lease if it is free, with a fencing token, in one step.
-- KEYS[1]  the lease hash   {prefix:name}:lease  (token, holder, fence, acquired)
-- KEYS[2]  the fence counter {prefix:name}:fence (no expiry)
-- ARGV[1]  token   ARGV[2]  ttl in milliseconds   ARGV[3]  holder id
-- Returns the fencing token (integer), or false when a live lease exists
-- (acquire() of _acquire.lua, which the store puts in front).
return acquire(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
