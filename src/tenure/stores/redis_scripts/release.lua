-- Compare-and-delete a lease; hand it to the queued waiter, if any; wake waiters.
-- KEYS[1]  the lease hash      {prefix:name}:lease
-- KEYS[2]  the fence counter   {prefix:name}:fence
-- KEYS[3]  the queued waiter   {prefix:name}:next   (see enlist.lua)
-- KEYS[4]  the hand-over list  {prefix:name}:handed (the queued waiter BLPOPs it)
-- ARGV[1]  token   ARGV[2]  the lease's release channel
-- Returns 1 when the live lease held by the token was deleted, else 0. An
-- expired lease is already gone (Redis expires it), so it also returns 0.
-- A lease handed to the queued waiter (for the entry's ttl) is announced on
-- the list as '<waiter id>|<fence>|<ms since the waiter last called>'; the
-- other waiters are woken on the channel either way, so one of them queues next.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local left = redis.call('PTTL', KEYS[3])
if left >= 0 then
  local queued = redis.call('HMGET', KEYS[3], 'waiter', 'token', 'holder', 'ttl', 'life')
  redis.call('DEL', KEYS[3])
  local fence = grant(KEYS[1], KEYS[2], queued[2], queued[4], queued[3])
  local since = tonumber(queued[5]) - math.max(left, 0)
  redis.call('RPUSH', KEYS[4], string.format('%s|%d|%d', queued[1], fence, since))
  redis.call('PEXPIRE', KEYS[4], queued[4])
end
redis.call('PUBLISH', ARGV[2], '1')
return 1
