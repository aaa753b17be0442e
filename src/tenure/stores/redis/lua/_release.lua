-- Prepended (after _grant.lua) to the scripts that release leases (release,
-- releases).
-- release(lease, fence_key, next, handed, token, channel): compare-and-delete
-- the lease held by token; hand it to the queued waiter, if any (see
-- enlist.lua); wake the waiters. Returns 1 when the live lease held by the
-- token was deleted, else 0. An expired lease is already gone (Redis expires
-- it), so it also returns 0. A lease handed to the queued waiter (for the
-- entry's ttl) is announced on the hand-over list as
-- '<waiter id>|<fence>|<ms since the waiter last called>'; the other waiters
-- are woken on the channel either way, so one of them queues next.
local function release(lease, fence_key, next, handed, token, channel)
  if redis.call('HGET', lease, 'token') ~= token then
    return 0
  end
  redis.call('DEL', lease)
  local left = redis.call('PTTL', next)
  if left >= 0 then
    local queued = redis.call('HMGET', next, 'waiter', 'token', 'holder', 'ttl', 'life')
    redis.call('DEL', next)
    local fence = grant(lease, fence_key, queued[2], queued[4], queued[3])
    local since = tonumber(queued[5]) - math.max(left, 0)
    redis.call('RPUSH', handed, string.format('%s|%d|%d', queued[1], fence, since))
    redis.call('PEXPIRE', handed, queued[4])
  end
  redis.call('PUBLISH', channel, '1')
  return 1
end
