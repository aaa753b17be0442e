-- Extend every lease of a batch whose token is still current, in one step.
-- KEYS[i]      the lease hashes {prefix:name}:lease
-- ARGV[2i-1]   the token for KEYS[i]   ARGV[2i]  its ttl in milliseconds
-- Returns a list of 1 (extended) or 0 (token gone or lease expired), in order.
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('HGET', key, 'token') == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
