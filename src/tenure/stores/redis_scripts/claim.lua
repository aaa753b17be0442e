-- Compare-and-advance the last claimed occurrence of scheduled tasks, each on its own.
-- KEYS[i]  {prefix:claims}:task (every claim key is in one hash slot)
-- ARGV[2i-1]  the occurrence's fire time (seconds)   ARGV[2i]  the claimant
-- A key holds '<fire time>\n<claimant>'.
-- Returns one answer per key: 1 when its fire time is later than the last claim
-- (and is now the last), or when this claimant made the last claim, of this fire
-- time (a resent claim); else 0.
local answers = {}
for i, key in ipairs(KEYS) do
  local fire, claimant = ARGV[2 * i - 1], ARGV[2 * i]
  local answer = 1
  local last = redis.call('GET', key)
  if last then
    local sep = string.find(last, '\n', 1, true)
    if not sep then
      return redis.error_reply('tenure: claim key ' .. key .. ' is of an older shape')
    end
    local was = tonumber(string.sub(last, 1, sep - 1))
    if was > tonumber(fire) then
      answer = 0
    elseif was == tonumber(fire) then
      answer = (string.sub(last, sep + 1) == claimant) and 1 or 0
    end
  end
  if answer == 1 then
    redis.call('SET', key, fire .. '\n' .. claimant)
  end
  answers[i] = answer
end
return answers
