-- A waiter gives up: leave the queue, and say whether a release handed it the lease.
-- KEYS[1]  the lease hash    {prefix:name}:lease
-- KEYS[2]  the queued waiter {prefix:name}:next
-- ARGV[1]  token   ARGV[2]  waiter id
-- Returns {fence, pttl} when the lease is the token's (handed over while it
-- waited; pttl ms are left), else false.
if redis.call('HGET', KEYS[2], 'waiter') == ARGV[2] then
  redis.call('DEL', KEYS[2])
end
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  return {tonumber(redis.call('HGET', KEYS[1], 'fence')), redis.call('PTTL', KEYS[1])}
end
return false
