-- Prepended by the store to every script that grants a lease (acquire,
-- enlist, release), so that the fence rule is written once.
-- grant(lease, fence_key, token, ttl_ms, holder): create the lease hash for
-- token with a PX of ttl_ms; returns its fencing token. The token is one more
-- than the name's last and never below the server's TIME in microseconds, so
-- a Redis that restarted empty (no persistence) still hands out larger ones.
local function grant(lease, fence_key, token, ttl_ms, holder)
  local now = redis.call('TIME')
  local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local fence = tonumber(redis.call('GET', fence_key) or '0') + 1
  if fence < now_us then
    fence = now_us
  end
  redis.call('SET', fence_key, string.format('%d', fence))
  redis.call('HSET', lease, 'token', token, 'holder', holder,
             'fence', string.format('%d', fence), 'acquired', now[1])
  redis.call('PEXPIRE', lease, ttl_ms)
  return fence
end
