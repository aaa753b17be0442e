-- Acquire for a waiter: grant the lease if it is free; else queue the waiter
-- as the one the next release hands the lease to (see release.lua).
-- KEYS[1]  the lease hash    {prefix:name}:lease
-- KEYS[2]  the fence counter {prefix:name}:fence
-- KEYS[3]  the queued waiter {prefix:name}:next  (waiter, token, holder, ttl, life)
-- ARGV[1]  token   ARGV[2]  ttl in milliseconds   ARGV[3]  holder id
-- ARGV[4]  waiter id (public: it names the waiter on the hand-over list)
-- ARGV[5]  how long the queue entry lives unless the waiter calls again, ms
-- ARGV[6]  the lease a release hands over lasts this long, ms (the new
--          holder's renewer extends it to its TTL)
-- Returns {1, fence}        granted now, for ARGV[2] ms;
--         {2, fence, pttl}  already this token's: a release handed it over
--                           (its note is on the way); pttl ms are left;
--         {0, pttl}         held (pttl ms left); this waiter is queued next;
--         {-1, pttl}        held; another waiter is queued next.
local current = redis.call('HGET', KEYS[1], 'token')
if current == ARGV[1] then
  return {2, tonumber(redis.call('HGET', KEYS[1], 'fence')), redis.call('PTTL', KEYS[1])}
end
local queued = redis.call('HGET', KEYS[3], 'waiter')
if not current then
  if queued == ARGV[4] then
    redis.call('DEL', KEYS[3])
  end
  return {1, grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])}
end
if not queued then
  redis.call('HSET', KEYS[3], 'waiter', ARGV[4], 'token', ARGV[1], 'holder', ARGV[3],
             'ttl', ARGV[6], 'life', ARGV[5])
elseif queued ~= ARGV[4] then
  return {-1, redis.call('PTTL', KEYS[1])}
end
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return {0, redis.call('PTTL', KEYS[1])}
