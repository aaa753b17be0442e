-- Compare-and-set one entry of the control board (stores.board).
-- KEYS[1]  {prefix:board}:KIND  (hash key -> value)
-- ARGV[1]  key   ARGV[2] '1' when an entry is expected, '0' when none is
-- ARGV[3]  the expected value   ARGV[4] '1' to set, '0' to remove
-- ARGV[5]  the new value
-- Returns 1 when the entry held what was expected (and was changed), else 0.
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  if stored ~= ARGV[3] then
    return 0
  end
elseif stored then
  return 0
end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[5])
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
