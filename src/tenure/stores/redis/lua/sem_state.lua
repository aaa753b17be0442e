-- What an operator may see of a semaphore (tenure.stores.semaphores): never a token.
-- KEYS see _sem.lua. Returns {now_ms, limit or '', waiting, then per live
-- permit its expires_ms and "fence acquired_s holder"}.
local ms = now_ms()
local after = '(' .. ms
local live = redis.call('ZRANGEBYSCORE', KEYS[2], after, '+inf', 'WITHSCORES')
local out = {ms, redis.call('GET', KEYS[5]) or '', redis.call('ZCOUNT', KEYS[4], after, '+inf')}
for i = 1, #live, 2 do
  out[#out + 1] = live[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[1], live[i])
end
return out
