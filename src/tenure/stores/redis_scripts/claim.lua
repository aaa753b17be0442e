-- Compare-and-advance the last claimed occurrence of a scheduled task.
-- KEYS[1]  {prefix:claims}:task   ARGV[1]  the occurrence's fire time (seconds)
-- Returns 1 when ARGV[1] is later than the last claim (and is now the last), else 0.
local last = redis.call('GET', KEYS[1])
if last and tonumber(last) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
