-- Compare-and-delete a lease, and wake its waiters.
-- KEYS[1]  the lease hash {prefix:name}:lease
-- ARGV[1]  token   ARGV[2]  the lease's release channel
-- Returns 1 when the live lease held by the token was deleted, else 0. An
-- expired lease is already gone (Redis expires it), so it also returns 0.
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
