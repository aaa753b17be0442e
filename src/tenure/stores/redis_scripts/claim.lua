-- Compare-and-advance the last claimed occurrence of a scheduled task.
-- KEYS[1]  {prefix:claims}:task
-- ARGV[1]  the occurrence's fire time (seconds)   ARGV[2]  the claimant
-- The key holds '<fire time>\n<claimant>'.
-- Returns 1 when ARGV[1] is later than the last claim (and is now the last), or
-- when this claimant made the last claim, of this fire time (a resent claim); else 0.
local last = redis.call('GET', KEYS[1])
if last then
  local sep = string.find(last, '\n', 1, true)
  if not sep then
    return redis.error_reply('tenure: claim key ' .. KEYS[1] .. ' is of an older shape')
  end
  local fire = tonumber(string.sub(last, 1, sep - 1))
  if fire > tonumber(ARGV[1]) then
    return 0
  end
  if fire == tonumber(ARGV[1]) then
    return string.sub(last, sep + 1) == ARGV[2] and 1 or 0
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. '\n' .. ARGV[2])
return 1
